"""Keep secret values out of everything resctl writes or prints.

One place decides what looks secret, by name and by shape:

- **by name**: an environment variable, rendezvous setting, profile key or command-line flag whose name
  has a part such as TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL, AUTH or PAT (`HF_TOKEN`,
  `WANDB_API_KEY`, `GITHUB_PAT`, `--api-token`); `TOKENIZERS_PARALLELISM` and `PYTHONPATH` are not;
- **by shape**: credentials in URLs (`postgres://user:pw@db/x` -> `postgres://user:<redacted>@db/x`;
  `?token=`, `?sig=`, `?X-Amz-Signature=` values; key-like path segments such as a webhook's secret),
  `password=...`-style pairs inside a value, and well-known token formats (`ghp_...`, `hf_...`,
  `github_pat_...`, `glpat-...`, `xoxb-...`, `sk-...`, AWS access key ids, JWTs);
- **rendezvous settings**: every `rdzv_conf` value except the known harmless ones (`is_host`,
  timeouts, ...), since a custom rendezvous handler may take a token there.

Used by `resctl run --dry-run`, `resctl profile show`, profile error messages, the run directory's
plan.json, the launcher's log, the events (an exception's text and traceback), fatal.json and the
failure summary.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

MASK = "<redacted>"
_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
_SECRET_PART = re.compile(
    r"^(api|access|auth|bearer|client|private|refresh|session)?"
    r"(token|tokens|secret|secrets|password|passwords|passwd|pwd|pass|passphrase|key|keys|apikey|credential|"
    r"credentials|auth|pat|cookie|signature|dsn)\d*$",
    re.IGNORECASE,
)
# Inside one word too: MYTOKEN, DBPASSWORD, APPSECRET (TOKENIZERS_PARALLELISM and --tokenizer are not secrets).
_SECRET_SUBSTRING = re.compile(r"SECRET|PASSWORD|PASSWD|CREDENTIAL|TOKEN(?!IZ)|APIKEY", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]*)(?::(?P<pw>[^/\s@]*))?@")
_PAIR = re.compile(
    r"(?P<key>[A-Za-z0-9_.-]*(?:token|secret|password|passwd|pwd|apikey|api_key|access_key|credential|auth)"
    r"[A-Za-z0-9_.-]*)(?P<sep>\s*[=:]\s*)(?P<value>[^\s&;,]+)",
    re.IGNORECASE,
)
_TOKEN_SHAPES = re.compile(
    r"(?:ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|hf_|glpat-|xox[abprs]-|sk-|sk_live_|rk_live_|npm_|pypi-)"
    r"[A-Za-z0-9_\-]{8,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#'\"<>]*)(?P<path>/[^\s?#'\"<>]*)?"
                  r"(?P<query>\?[^\s#'\"<>]*)?")
# Query parameters that carry a credential whatever their value looks like (presigned URLs, API keys).
_SECRET_PARAMS = frozenset({"key", "sig", "signature", "code", "x-amz-signature", "x-amz-credential",
                            "x-amz-security-token", "x-goog-signature", "x-goog-credential"})
_WORD_SPLIT = re.compile(r"[-_.~+]")


def _random_looking(segment: str) -> bool:
    """A URL path segment that looks like a key, not a name: one run of 16+ characters mixing at
    least two of lower case, upper case and digits (`aB3dE6gH9jK2mN5pQ8rS1tU4`, a hex digest); a
    name of short words (`Llama-3.1-8B-Instruct`, a UUID, `step-000010`) is not."""
    for piece in _WORD_SPLIT.split(segment):
        if len(piece) >= 16 and sum((any(c.islower() for c in piece), any(c.isupper() for c in piece),
                                     any(c.isdigit() for c in piece))) >= 2:
            return True
    return False


def _redact_url(m: re.Match[str]) -> str:
    path = m.group("path") or ""
    if path:
        path = "/".join(MASK if _random_looking(seg) else seg for seg in path.split("/"))
    query = m.group("query") or ""
    if query:
        def param(kv: str) -> str:
            name, sep, value = kv.partition("=")
            secret = sep and value and (name.lower() in _SECRET_PARAMS or secret_name(name))
            return f"{name}={MASK}" if secret else kv

        query = "?" + "&".join(param(kv) for kv in query[1:].split("&"))
    return m.group("head") + path + query


# Rendezvous settings with harmless values (torch's c10d handler and ft_launcher); the rest are masked.
SAFE_RDZV_CONF = frozenset({
    "is_host", "timeout", "join_timeout", "last_call_timeout", "close_timeout", "read_timeout", "keep_alive_interval",
    "keep_alive_max_attempt", "use_libuv", "upscaling_enabled", "store_type", "local_addr",
})


def secret_name(name: str) -> bool:
    """True for names that hold secrets: HF_TOKEN, WANDB_API_KEY, GITHUB_PAT, --api-token, db.password."""
    if _SECRET_SUBSTRING.search(name):
        return True
    return any(_SECRET_PART.match(part) for part in _PARTS.split(name) if part)


def redact_text(text: str) -> str:
    """`text` with secret-shaped parts masked: URL credentials, password=... pairs, known token formats."""
    def userinfo(m: re.Match[str]) -> str:
        if m.group("pw") is not None:
            return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
        return f"{m.group('scheme')}{MASK}@"  # https://TOKEN@host: the user part is the secret

    text = _URL.sub(_redact_url, text)  # before the user info gets a MASK (its < > end a URL)
    text = _URL_USERINFO.sub(userinfo, text)
    text = _PAIR.sub(lambda m: f"{m.group('key')}{m.group('sep')}{MASK}", text)
    return _TOKEN_SHAPES.sub(MASK, text)


def redact_value(name: str, value: Any) -> Any:
    """A value fit to show: masked when its name is secret, else its secret-shaped parts masked (recursively)."""
    if isinstance(value, Mapping):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(name, v) for v in value]
    if secret_name(name) and value not in (None, ""):
        return MASK
    return redact_text(value) if isinstance(value, str) else value


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: redact_value(name, value) for name, value in env.items()}


def redact_rdzv_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if k in SAFE_RDZV_CONF else MASK for k, v in conf.items()}


def _redact_conf_arg(value: str) -> str:
    def one(kv: str) -> str:
        key, sep, val = kv.partition("=")
        return f"{key}={val if key.strip() in SAFE_RDZV_CONF else MASK}" if sep else kv

    return ",".join(one(kv) for kv in value.split(","))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to show: `--api-token X`, `--api-token=X`, `--rdzv-conf k=v` and secret shapes masked."""
    out: list[str] = []
    mask_next = conf_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
        elif conf_next:
            out.append(_redact_conf_arg(arg))
        elif arg.startswith("-") and "=" in arg:
            flag, value = arg.split("=", 1)
            if flag.lstrip("-") in ("rdzv-conf", "rdzv_conf"):
                out.append(f"{flag}={_redact_conf_arg(value)}")
            else:
                out.append(f"{flag}={MASK}" if secret_name(flag.lstrip('-')) and value else redact_text(arg))
        else:
            out.append(redact_text(arg))
        is_flag = arg.startswith("-") and "=" not in arg and not mask_next and not conf_next
        mask_next = is_flag and len(arg.lstrip("-")) > 0 and secret_name(arg.lstrip("-"))
        conf_next = is_flag and arg.lstrip("-") in ("rdzv-conf", "rdzv_conf")
    return out

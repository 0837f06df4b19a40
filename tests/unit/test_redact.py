"""resctl.redact: what counts as a secret, by name and by shape."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctl.redact import MASK, redact_argv, redact_env, redact_rdzv_conf, redact_text, secret_name


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "GITHUB_PAT", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                                  "apiToken", "--api-token", "api_key", "MY_PASSWD", "SLACK_AUTH", "hf-token2"])
def test_secret_names(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", ["PYTHONPATH", "TOKENIZERS_PARALLELISM", "FI_PROVIDER", "NCCL_SOCKET_IFNAME",
                                  "DATABASE_URL", "--tokenizer", "--lr", "KEYBOARD_LAYOUT", "CUDA_VISIBLE_DEVICES"])
def test_harmless_names(name: str) -> None:
    assert not secret_name(name)


def test_env_by_name_and_by_shape() -> None:
    shown = redact_env({"HF_TOKEN": "hf_abcdefghijkl", "DATABASE_URL": "postgres://u:pw1@db:5432/x",
                        "FI_PROVIDER": "efa", "REPO": "https://ghp_abcdefghijklmnop@github.com/o/r",
                        "OPTS": "host=db password=pw2 sslmode=require", "AWS_ID": "AKIAABCDEFGHIJKLMNOP"})
    assert shown["HF_TOKEN"] == MASK and shown["FI_PROVIDER"] == "efa"
    assert shown["DATABASE_URL"] == f"postgres://u:{MASK}@db:5432/x"
    assert shown["REPO"] == f"https://{MASK}@github.com/o/r"
    assert "pw2" not in shown["OPTS"] and "sslmode=require" in shown["OPTS"]
    assert shown["AWS_ID"] == MASK


def test_argv() -> None:
    argv = ["--rdzv-conf", "is_host=1,token=SEC0,join_timeout=60", "train.py", "--api-token", "SEC1",
            "--api_key=SEC2", "--lr", "3e-4", "--url", "https://a:SEC3@h/x", "--tokenizer", "gpt2", "--hub", "hf_SEC4abcdef"]
    shown = redact_argv(argv)
    assert "SEC" not in " ".join(shown)
    assert shown[1] == f"is_host=1,token={MASK},join_timeout=60"
    assert shown[shown.index("--lr") + 1] == "3e-4" and shown[shown.index("--tokenizer") + 1] == "gpt2"
    assert len(shown) == len(argv)


def test_rdzv_conf_keeps_only_known_harmless_values() -> None:
    assert redact_rdzv_conf({"is_host": "1", "timeout": 900, "store_token": "x"}) == \
        {"is_host": "1", "timeout": 900, "store_token": MASK}


def test_text_without_secrets_is_unchanged() -> None:
    for text in ("3e-4", "/data/train", "http://host:8080/path", "a=b", "resctl-runs/{run_id}"):
        assert redact_text(text) == text


def test_launcher_log_records_lose_rdzv_secrets_and_stop_tracebacks() -> None:
    import logging
    import sys

    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing.api import SignalException

    from resctl.launch.launcher_logs import scrub

    record = logging.LogRecord("ft", logging.INFO, __file__, 1, "rdzv_configs : %(rdzv_configs)s",
                               ({"rdzv_configs": {"token": "SEC5", "is_host": "1"}},), None)
    shown = scrub(record).getMessage()
    assert "SEC5" not in shown and "is_host': '1'" in shown
    try:
        try:
            raise SignalException("Process 1 got signal: 15", sigval=15)
        except SignalException:
            raise RuntimeError("worker exited 143")  # noqa: B904 - the implicit chain is what is tested
    except RuntimeError:
        stopped = logging.LogRecord("ft", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert scrub(stopped).exc_info is None and "traceback omitted" in stopped.getMessage()
    try:
        raise KeyError("a real bug")
    except KeyError:
        bug = logging.LogRecord("ft", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert scrub(bug).exc_info is not None


# Issue 27, item 7: secret names inside one word, and secrets in URL paths and query strings.
@pytest.mark.parametrize("name", ["MYTOKEN", "appsecret", "DBPASSWORD", "HUBTOKEN2"])
def test_secret_names_inside_one_word(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("url", [
    "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct", "s3://bucket/ckpt/123e4567-e89b-12d3-a456-426614174000/",
    "file:///data/step-000000010/a.bin", "https://host/x?page=2&limit=10", "KeyError: 'model'",
])
def test_names_in_urls_are_not_secrets(url: str) -> None:
    assert redact_text(url) == url


_SECRET = st.text(alphabet="abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=16, max_size=40).filter(
    lambda s: any(c.islower() for c in s) and any(c.isupper() for c in s) and any(c.isdigit() for c in s))
_FORMS = ["https://user:{s}@host.example/x", "https://host.example/x?token={s}&page=2",
          "https://hooks.example/services/T0/B0/{s}", "https://s3.example/b/k?X-Amz-Signature={s}",
          "https://api.example/v1?key={s}", "hf_{s}", "https://{s}@github.com/o/r"]


@given(secret=_SECRET, form=st.sampled_from(_FORMS), before=st.sampled_from(["", "RuntimeError: cannot fetch ", "("]),
       after=st.sampled_from(["", " (HTTP 401)", ")", "\n  File \"x.py\", line 1"]))
def test_a_secret_in_an_exception_text_is_masked(secret: str, form: str, before: str, after: str) -> None:
    text = before + form.format(s=secret) + after
    shown = redact_text(text)
    assert secret not in shown and MASK in shown


def test_launcher_log_records_lose_secrets_in_messages_and_tracebacks() -> None:
    import logging
    import sys

    from resctl.launch.launcher_logs import scrub

    try:
        raise RuntimeError("GET https://u:logSECRET1@h/x?token=logSECRET2")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = scrub(logging.LogRecord("x", logging.ERROR, __file__, 1, "worker failed: %s", (exc_info[1],), exc_info))
    shown = logging.Formatter().format(record)
    assert "logSECRET" not in shown and "worker failed" in shown and "RuntimeError" in shown

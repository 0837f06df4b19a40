"""resctl.redact: what counts as a secret, by name and by shape."""

from __future__ import annotations

import pytest

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

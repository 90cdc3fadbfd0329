"""Secrets never survive redaction; ordinary names and values stay readable."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro500.redact import REDACTED, is_secret_name, redact_env, redact_text, redact_url, scrub

# Realistic-looking fake credentials (none of them is valid anywhere).
SECRETS = {
    "aws_key_id": "AKIAIOSFODNN7EXAMPLE",
    "aws_secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "github_pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCD",
    "hf": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "slack": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "openai": "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe",
    "gitlab": "glpat-abcdefghij0123456789",
}


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "apiKey",
                                  "X-Auth-Token", "DB_PASSWORD", "MYTOKEN", "client_secret",
                                  "SESSION_COOKIE", "private_key", "mlflow_tracking_password"])
def test_secret_names_are_recognised(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "PWD", "tokenizer", "author", "monkey",
                                  "max_tokens", "batch_size", "CUDA_VISIBLE_DEVICES", "SHELL"])
def test_ordinary_names_are_not_secret(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("secret", list(SECRETS.values()))
def test_credential_content_is_redacted_inside_free_text(secret):
    text = f"config line one\nvalue = {secret} # trailing\nlast"
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out
    assert out.startswith("config line one\n") and out.endswith("\nlast")


def test_pem_blocks_and_assignments_are_redacted_but_code_stays_readable():
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nabc\n-----END RSA PRIVATE KEY-----"
    truncated = "+-----BEGIN OPENSSH PRIVATE KEY-----\n+b3BlbnNzaC1rZXktdjEAAAAA"
    assert "MIIEowIBAAKCAQEA7" not in redact_text(f"before\n{pem}\nafter")
    assert "b3BlbnNzaC1rZX" not in redact_text(truncated)
    assert redact_text('password = "hunter2hunter2"') == f'password = "{REDACTED}"'
    assert redact_text("AccountKey=abcdefghijk123==;x") == f"AccountKey={REDACTED};x"
    for code in ["sort_key = lambda x: x[0]", "token = self.get_token()",
                 'tokenizer = "bert-base-uncased"', "spawn_key=(repeat, rank)"]:
        assert redact_text(code) == code


def test_urls_lose_credentials_but_keep_host():
    assert redact_url("https://alice:pw123@github.com/org/repo.git") == \
        f"https://{REDACTED}@github.com/org/repo.git"
    assert redact_url(f"https://{SECRETS['github']}@github.com/o/r") == \
        f"https://{REDACTED}@github.com/o/r"
    assert redact_url("ssh://git@github.com/org/repo.git") == "ssh://git@github.com/org/repo.git"
    assert redact_url("git@github.com:org/repo.git") == "git@github.com:org/repo.git"
    assert redact_url("postgresql://u:p4ss@db:5432/x") == f"postgresql://{REDACTED}@db:5432/x"
    assert "s3cret" not in redact_text("see http://bob:s3cret@10.0.0.1:8080/x for details")


def test_env_keeps_values_only_for_result_relevant_non_secret_names():
    env = {
        "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONHASHSEED": "0", "MASTER_ADDR": "10.0.0.1", "HOME": "/home/alice",
        "GITHUB_TOKEN": SECRETS["github"], "AWS_SECRET_ACCESS_KEY": SECRETS["aws_secret"],
        "TORCH_HUB_TOKEN": SECRETS["hf"],  # allowlisted prefix, but a secret name
        "TORCH_DIST_INIT": "tcp://bob:HunterPw2@10.0.0.1:29500",  # allowlisted, creds in value
    }
    out = redact_env(env)
    assert out["values"]["NCCL_DEBUG"] == "INFO"
    assert out["values"]["MASTER_ADDR"] == "10.0.0.1"
    assert out["values"]["TORCH_DIST_INIT"] == f"tcp://{REDACTED}@10.0.0.1:29500"
    assert "HOME" in out["names"] and "HOME" not in out["values"]
    assert {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "TORCH_HUB_TOKEN"} <= set(out["names"])
    blob = json.dumps(out)
    for secret in (*SECRETS.values(), "HunterPw2", "/home/alice"):
        assert secret not in blob


def test_scrub_redacts_secret_keys_and_credential_strings_recursively():
    data = {
        "lr": 0.1, "tokenizer": "bert", "use_auth": True, "api_key": None,
        "credentials": {"user": "bob", "pw": "hunter2hunter2"},
        "nested": [{"password": "p4ssw0rd!"}, f"see {SECRETS['aws_key_id']}"],
        "tracking_uri": "https://bob:pw@mlflow.example.com",
    }
    out = scrub(data)
    assert out["lr"] == 0.1 and out["tokenizer"] == "bert" and out["use_auth"] is True
    assert out["api_key"] is None  # nothing to hide
    assert out["credentials"] == REDACTED
    assert out["nested"][0]["password"] == REDACTED
    assert SECRETS["aws_key_id"] not in json.dumps(out)
    assert out["tracking_uri"] == f"https://{REDACTED}@mlflow.example.com"
    assert data["credentials"]["pw"] == "hunter2hunter2"  # the input is not modified


_json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20))


@settings(max_examples=150, deadline=None)
@given(
    tree=st.recursive(
        _json_leaves,
        lambda children: st.one_of(st.lists(children, max_size=4),
                                   st.dictionaries(st.text(max_size=8), children, max_size=4)),
        max_leaves=20,
    ),
    secret=st.sampled_from(list(SECRETS.values())),
    prefix=st.text(alphabet=" \n:=,;({[", max_size=3),
)
def test_scrub_never_leaks_a_planted_credential(tree, secret, prefix):
    planted = {"data": tree, "note": f"{prefix}{secret}{prefix}", "list": [tree, secret]}
    assert secret not in json.dumps(scrub(planted), ensure_ascii=False)


@pytest.mark.parametrize("text, secret", [
    ("+DB_PASSWORD=hunter2", "hunter2"),
    ("+password: hunter2", "hunter2"),
    ("api_key = 'abc'", "abc"),
    ("postgresql://u@h/db?sslmode=require&password=hunter2", "hunter2"),
    ("https://h/db?password=abc123", "abc123"),
])
def test_short_secrets_after_a_secret_name_are_redacted(text, secret):
    out = redact_url(text) if "://" in text else redact_text(text)
    assert secret not in out and REDACTED in out


def test_query_strings_keep_their_harmless_parameters():
    url = "postgresql://db:5432/x?sslmode=require&password=hunter2&application_name=repro500"
    assert redact_url(url) == f"postgresql://db:5432/x?sslmode=require&password={REDACTED}&application_name=repro500"
    for code in ["password = None", "token: null", "if password: pass"]:
        assert redact_text(code) == code


@pytest.mark.parametrize("url", [
    "sqlite:////srv/lab/mlflow.db", "sqlite:///mlflow.db", "sqlite:///rel/dir/x.db?mode=ro",
    "file:///tmp/mlruns", "http://127.0.0.1:5000", "https://host:8443/a/b?x=1#frag",
    "http://[::1]:5000/x", "s3://bucket/key/", "ssh://git@github.com/o/r.git", "git@github.com:o/r.git",
    "https://host/p@th", "databricks://profile:prefix",
])
def test_urls_without_credentials_round_trip_exactly(url):
    assert redact_url(url) == url


@pytest.mark.parametrize("url, expected", [
    ("http://u:pw@127.0.0.1:1", f"http://{REDACTED}@127.0.0.1:1"),
    ("postgresql://u:p%40ss@db:5432//abs?sslmode=require", f"postgresql://{REDACTED}@db:5432//abs?sslmode=require"),
    ("https://tok123@host/x", f"https://{REDACTED}@host/x"),
    ("https://host/x?user=bob&password=hunter2#f", f"https://host/x?user=bob&password={REDACTED}#f"),
    ("mysql://root:p@ss@localhost/mlflow", f"mysql://{REDACTED}@localhost/mlflow"),
])
def test_url_credentials_go_and_everything_else_stays(url, expected):
    assert redact_url(url) == expected


def test_secret_values_are_scrubbed_under_any_key(monkeypatch):
    from repro500.redact import secret_values

    monkeypatch.setenv("WANDB_API_KEY", "abcd1234efgh")
    monkeypatch.setenv("DATABASE_URL", "postgresql://alice:Tr0ub4dor@db/x")
    monkeypatch.setenv("MY_TOKEN", "12345")  # too short to scrub by value
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/tmp")  # a path, not the secret
    found = secret_values()
    assert {"abcd1234efgh", "Tr0ub4dor"} <= found
    assert not {"12345", "/tmp", "alice"} & found
    data = {"argv": ["run", "--set", "fixed.model_options.note=abcd1234efgh"],
            "nested": [{"note": "db pw is Tr0ub4dor, keep this"}], "abcd1234efgh": 1, "n": 12345, "dir": "/tmp"}
    out = scrub(data)
    text = json.dumps(out)
    assert "abcd1234efgh" not in text and "Tr0ub4dor" not in text
    assert out["argv"] == ["run", "--set", f"fixed.model_options.note={REDACTED}"]
    assert out["nested"][0]["note"] == f"db pw is {REDACTED}, keep this"
    assert out["n"] == 12345 and out["dir"] == "/tmp" and out[REDACTED] == 1
    assert redact_text("error: API key abcd1234efghXYZ rejected") == f"error: API key {REDACTED}XYZ rejected"
    assert redact_url("https://host/abcd1234efgh") == f"https://host/{REDACTED}"
    env = redact_env({"REPRO500_NOTE": "abcd1234efgh", "WANDB_API_KEY": "abcd1234efgh"})
    assert env["values"] == {"REPRO500_NOTE": REDACTED}


def test_explicit_values_override_the_environment(monkeypatch):
    monkeypatch.setenv("SOME_SECRET", "from-the-environment")
    assert scrub(["from-the-environment"], values=()) == ["from-the-environment"]
    assert scrub(["a longer-value b"], values={"longer-value"}) == [f"a {REDACTED} b"]
    # a value that contains another is replaced whole
    assert redact_text("xx-abcdefgh-yy", values={"abcdef", "abcdefgh"}) == f"xx-{REDACTED}-yy"

"""Keep secrets out of everything repro500 writes.

Two independent tests decide that something is secret:

* its **name** looks secret (:func:`is_secret_name`): an environment variable, a JSON key
  or an assignment in a diff called ``GITHUB_TOKEN``, ``aws_secret_access_key``,
  ``apiKey``, ``DB_PASSWORD`` ...;
* its **content** looks like a credential (:func:`redact_text`): cloud access keys,
  GitHub/GitLab/Hugging Face/Slack/OpenAI tokens, JWTs, ``scheme://user:pass@host`` URLs,
  PEM blocks.

A third test works **by value** (:func:`secret_values`): the value of every environment
variable with a secret-looking name, and the password in any URL held by an environment
variable, is replaced wherever it appears, whatever key it sits under (``--set
fixed.model_options.note=$WANDB_API_KEY`` must not land in ``run.json``'s argv).

A name test is for names someone chose (an environment variable, a model option, a
command's own ``mutable`` key); it never applies to a field a document's own schema defines
(a recipe's ``metrics.f1.key`` names a JSON key, not a credential): :func:`scrub` takes
``named`` to tell the two apart.

Either way the value is replaced by :data:`REDACTED`.  Manifests, MLflow params and tags,
diffs and reports all pass through here (:func:`scrub` for JSON data), so a secret never
reaches a file, a tracking server or a published bundle.
"""

from __future__ import annotations

import functools
import keyword
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote

REDACTED = "[REDACTED]"

# A name is split into words (``_``, ``-``, ``.``, spaces, camelCase); it is secret when a
# word is one of these.  Whole words, not substrings, so ``tokenizer``, ``monkey`` or
# ``author`` stay readable while ``HF_TOKEN``, ``apiKey`` and ``X-Auth-Token`` do not.
SECRET_WORDS = frozenset(
    {
        "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PASSPHRASE",
        "KEY", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY", "CREDENTIAL", "CREDENTIALS",
        "CREDS", "AUTH", "AUTHORIZATION", "COOKIE", "COOKIES", "SESSION", "SESSIONID",
        "PRIVATE", "SIGNATURE", "SALT", "BEARER", "JWT", "DSN",
    }
)
# Compound words written without separators (``MYTOKEN``, ``dbpassword``).
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "CREDENTIALS")
# Names that contain a secret word but are well known not to hold one.
_NOT_SECRET_NAMES = frozenset(
    {"PWD", "OLDPWD", "SSH_AUTH_SOCK", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS",
     "XDG_SESSION_DESKTOP"}
)

_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

# Content patterns, each matching the secret itself (replaced whole).
_TOKEN_PATTERNS = [
    re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),  # AWS key id
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),  # GitHub tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}\b"),  # GitHub fine-grained tokens
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b"),  # GitLab
    re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),  # Hugging Face
    re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{10,}\b"),  # Slack tokens
    re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+"),  # Slack webhooks
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}\b"),  # OpenAI / Anthropic
    re.compile(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}\b"),  # Stripe
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),  # Google API keys
    re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"),  # npm
    re.compile(r"\bpypi-[A-Za-z0-9_-]{50,}\b"),  # PyPI upload tokens
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
    # An AWS secret access key: exactly 40 base64 characters with upper, lower and digits.
    # Requiring all three classes spares git/torch commit ids (40 lower-case hex digits).
    # ``=`` may touch it on either side (``KEY=<secret>``, ``=<secret>=``): it is a separator
    # there, and a key padded with ``=`` would no longer be 40 characters.
    re.compile(r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])"
               r"(?=[A-Za-z0-9/+]{0,39}[0-9])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
]
# What each of _TOKEN_PATTERNS cannot match without: a pattern whose hints are all absent from a
# text is not run (a substring test is ~50x faster than a scan with a look-behind at every
# position, and run artifacts are tens of kilobytes); None: always run.
_TOKEN_HINTS: list[tuple[str, ...] | None] = [
    ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"), ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ("github_pat_",), ("glpat-",), ("hf_",), ("xox",), ("hooks.slack.com/services/",), ("sk-",),
    ("k_live_", "k_test_"), ("AIza",), ("npm_",), ("pypi-",), ("eyJ",), None,
]
# A name _strong_secret_name accepts holds one of these (lower-cased): every _STRONG_WORDS entry and
# _SECRET_SUFFIXES entry contains one, and a qualified KEY contains "key".
_STRONG_STEMS = ("token", "secret", "pass", "key", "cred", "cookie", "sessionid", "authorization", "bearer",
                 "jwt", "dsn")
# A PEM block, or its beginning when the end was cut off (a diff hunk, a truncated value).
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.DOTALL
)
# ``scheme://user:password@host``: the user-info part goes, the host stays readable.
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s/@:]+):([^\s/@]+)@")
# ``NAME = value`` / ``NAME: value`` / ``"NAME": "value"`` in free text (diffs, logs) where
# NAME is *strongly* secret (:func:`_strong_secret_name`).  The value must look like a
# literal: a quoted string of 3+ characters or a bare 4+ character token that is not an
# attribute access or a call, so code such as ``token = self.get_token()`` stays readable.
# Short is allowed on purpose: ``DB_PASSWORD=hunter2`` is exactly what people commit.
_ASSIGNMENT = re.compile(
    r"""(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<q1>["']?)(?P<sep>\s*[:=]\s*)"""
    r"""(?P<value>"[^"\n]{3,}"|'[^'\n]{3,}'|[A-Za-z0-9+/_=:@~!%*#^-]{4,}(?![\w.(\[]))"""
)
# Bare words that are code, not a credential (``password = None``, ``token: null``,
# ``if password: pass``).
_LITERAL_WORDS = frozenset({*keyword.kwlist, "null", "true", "false", "none", "self", "nil"})
_BEARER = re.compile(r"\b(Bearer|Basic|token)\s+[A-Za-z0-9._~+/=-]{16,}")
_STRONG_WORDS = frozenset(
    {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PASSPHRASE",
     "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY", "CREDENTIAL", "CREDENTIALS", "CREDS",
     "COOKIE", "SESSIONID", "AUTHORIZATION", "BEARER", "JWT", "DSN"}
)
# ``KEY`` alone is too common in code (``sort_key``, ``spawn_key``); it is strongly secret
# only after one of these words (``API_KEY``, ``aws_secret_access_key``, ``AccountKey``).
_KEY_QUALIFIERS = frozenset(
    {"API", "ACCESS", "SECRET", "PRIVATE", "ACCOUNT", "SIGNING", "ENCRYPTION", "CLIENT", "APP",
     "SERVICE", "LICENSE", "SSH", "GPG", "MASTER", "SHARED", "STORAGE", "SUBSCRIPTION", "AUTH"}
)


def _words(name: str) -> list[str]:
    return [w.upper() for w in _WORD_SPLIT.split(name) if w]


def _strong_secret_name(name: str) -> bool:
    words = _words(name)
    if any(w in _STRONG_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words):
        return True
    return any(w == "KEY" and i > 0 and words[i - 1] in _KEY_QUALIFIERS
               for i, w in enumerate(words))


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """True when a variable/key name suggests its value is a credential."""
    upper = name.upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    words = _words(name)
    return any(w in SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words)


def _redact_assignment(match: re.Match[str]) -> str:
    if not _strong_secret_name(match.group("name")):
        return match.group(0)
    value = match.group("value")
    if value in _LITERAL_WORDS or value.startswith(("$", "${", "os.environ", "os.getenv", "getenv", REDACTED)):
        return match.group(0)  # a reference to a secret, not the secret itself
    quote = value[0] if value[0] in "\"'" else ""
    return f"{match.group('name')}{match.group('q1')}{match.group('sep')}{quote}{REDACTED}{quote}"


def redact_text(text: str, values: Iterable[str] | None = None) -> str:
    """Replace credential-looking content, and any secret value (:func:`secret_values`), in free text.

    ``values`` are the secret values to replace; by default those of the current environment.
    """
    if not text:
        return text
    text = _replace_values(text, secret_values() if values is None else values)
    if "-----BEGIN " in text:
        text = _PEM.sub(REDACTED, text)
    if "://" in text:
        text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    for pattern, hints in zip(_TOKEN_PATTERNS, _TOKEN_HINTS, strict=True):
        if hints is None or any(hint in text for hint in hints):
            text = pattern.sub(REDACTED, text)
    if any(word in text for word in ("Bearer", "Basic", "token")):
        text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    lower = text.lower()
    if any(stem in lower for stem in _STRONG_STEMS):
        text = _ASSIGNMENT.sub(_redact_assignment, text)
    return text


# Shorter values are not replaced by value: scrubbing "1" or "true" everywhere would destroy
# the record.  Short secrets are still caught next to their names and inside URLs.
MIN_SECRET_VALUE_CHARS = 6
_SSH_SCHEMES = ("ssh", "git+ssh", "ssh+git")


def _url_credentials(value: str) -> list[str]:
    """The password (or the lone token-like user of an http(s) URL) of each URL in *value*."""
    found = []
    for match in re.finditer(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s/?#]*)@", value):
        user, colon, password = match.group(2).partition(":")
        if colon:
            found += [password, unquote(password)]
        elif match.group(1).lower() not in _SSH_SCHEMES:
            found += [user, unquote(user)]
    return found


def secret_values(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Values to scrub wherever they appear: secret-named variables' values and URL passwords.

    Values shorter than :data:`MIN_SECRET_VALUE_CHARS` and values naming an existing file or
    directory (``GOOGLE_APPLICATION_CREDENTIALS=/path/key.json``: the path is not the secret)
    are left out.
    """
    environ = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in environ.items():
        if not value:
            continue
        if "://" in value:
            found.update(_url_credentials(value))
        if is_secret_name(name) and not (value.startswith(("/", "~")) and os.path.exists(os.path.expanduser(value))):
            found.add(value)
    return frozenset(v for v in found if len(v) >= MIN_SECRET_VALUE_CHARS)


@functools.lru_cache(maxsize=32)
def _values_pattern(values: frozenset[str]) -> re.Pattern[str]:
    # Longest first, so a value that contains another is replaced whole.
    return re.compile("|".join(re.escape(v) for v in sorted(values, key=lambda v: (-len(v), v))))


def redact_values(text: str, values: Iterable[str] | None = None) -> str:
    """Only the by-value part of :func:`redact_text`: each secret value (:func:`secret_values`)
    becomes :data:`REDACTED`; nothing else changes (for pages and files with embedded data)."""
    return _replace_values(text, secret_values() if values is None else values)


def _replace_values(text: str, values: Iterable[str]) -> str:
    values = values if isinstance(values, frozenset) else frozenset(values)
    if not values or not text:
        return text
    return _values_pattern(values).sub(REDACTED, text)


def _redact_query(query: str) -> str:
    """``?user=bob&password=x`` -> ``?user=bob&password=[REDACTED]``; the layout is kept byte for byte."""
    out = []
    for item in query.split("&"):
        name, sep, value = item.partition("=")
        out.append(f"{name}{sep}{REDACTED}" if sep and value and is_secret_name(name) else item)
    return "&".join(out)


def redact_url(url: str, values: Iterable[str] | None = None) -> str:
    """A URL with any credentials removed (``https://user:pw@host/x`` -> ``https://[REDACTED]@host/x``).

    A bare user name is kept for ssh-style URLs (``ssh://git@host``, ``git@host:org/repo``)
    and replaced for http(s), where a lone user name is almost always a token.  Everything
    else is kept byte for byte (``sqlite:////srv/lab/mlflow.db`` stays as it is): the URL is
    provenance, so it must still name the same place.
    """
    if "://" not in url:
        return redact_text(url, values)  # scp-like ``git@host:path`` or a local path
    scheme, sep, rest = url.partition("://")
    netloc = re.match(r"[^/?#]*", rest).group(0)
    tail = rest[len(netloc):]
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        tail = f"{path}?{_redact_query(query)}{hash_}{fragment}"
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        keep_user = ":" not in userinfo and scheme.lower() in _SSH_SCHEMES
        netloc = f"{userinfo if keep_user else REDACTED}@{host}"
    return redact_text(f"{scheme}{sep}{netloc}{tail}", values)


# Environment variables whose values can change a result; every other variable is recorded
# by name only.  Prefixes end with "_"; the rest are exact names.
ENV_VALUE_PREFIXES = (
    "CUDA_", "CUDNN_", "CUBLAS_", "CUBLASLT_", "NCCL_", "NVIDIA_", "OMP_", "KMP_", "GOMP_",
    "MKL_", "OPENBLAS_", "BLIS_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHELASTIC_",
    "HOROVOD_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "I_MPI_", "MV2_", "UCX_", "FI_",
    "GLOO_", "TRITON_", "HIP_", "ROCM_", "HSA_", "MIOPEN_", "XLA_", "ONEDNN_", "DNNL_",
    "ATEN_",  # ATEN_CPU_CAPABILITY picks torch's CPU kernels
    "REPRO500_",
)
ENV_VALUE_NAMES = frozenset(
    {
        "PYTHONHASHSEED", "PYTHONPATH", "PYTHONOPTIMIZE", "MASTER_ADDR", "MASTER_PORT",
        "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
        "ROLE_RANK", "LD_LIBRARY_PATH", "LD_PRELOAD", "CUDA_HOME", "CUDA_PATH",
        "CUBLAS_WORKSPACE_CONFIG", "DVC_NO_ANALYTICS", "MLFLOW_TRACKING_URI",
        "MLFLOW_EXPERIMENT_NAME", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS", "TZ", "LANG", "LC_ALL",
    }
)


def env_value_kept(name: str) -> bool:
    """True when an environment variable's value is recorded (allowlisted and not secret)."""
    return (name in ENV_VALUE_NAMES or name.startswith(ENV_VALUE_PREFIXES)) and not is_secret_name(name)


def redact_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Record an environment: ``{"values": {name: value}, "names": [name, ...]}``.

    Values are kept only for result-relevant variables (:data:`ENV_VALUE_PREFIXES`,
    :data:`ENV_VALUE_NAMES`), and even those pass through :func:`redact_text`; every other
    variable is listed by name only.  Secret-named variables are listed by name only too.
    """
    values: dict[str, str] = {}
    names: list[str] = []
    secrets = secret_values(environ) | secret_values()
    for name in sorted(environ):
        if env_value_kept(name):
            value = str(environ[name])
            values[name] = redact_url(value, secrets) if "://" in value else redact_text(value, secrets)
        else:
            names.append(name)
    return {"values": values, "names": names}


def scrub(obj: Any, values: Iterable[str] | None = None, *,
          named: Callable[[tuple[str, ...]], bool] | None = None) -> Any:
    """A copy of JSON-like data with secrets replaced by :data:`REDACTED`.

    Values under secret-looking keys are replaced whole (containers too, since a nested
    ``{"user": ..., "pw": ...}`` under ``credentials`` is secret as a unit); booleans and
    ``None`` are kept, they cannot hold a secret.  Every string anywhere is passed through
    :func:`redact_text`, and a secret value (:func:`secret_values`; ``values`` overrides the
    environment's) is replaced inside keys too.

    ``named(path)`` says whether the key at *path* (the keys from the top, the key itself last;
    a list item adds no key) is a name someone chose, which a secret-looking name hides; a key
    for which it answers False is a field of the document's own schema and is only scrubbed by
    content and by value.  Left out, every key is a chosen name.
    """
    found = secret_values() if values is None else frozenset(values)
    return _scrub(obj, found, named, ())


def _scrub(obj: Any, values: frozenset[str], named: Callable[[tuple[str, ...]], bool] | None,
           path: tuple[str, ...]) -> Any:
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            clean_key = _replace_values(key, values) if isinstance(key, str) else key
            here = (*path, str(key))
            if (isinstance(key, str) and is_secret_name(key) and not _harmless(value)
                    and (named is None or named(here))):
                out[clean_key] = REDACTED
            else:
                out[clean_key] = _scrub(value, values, named, here)
        return out
    if isinstance(obj, (list, tuple)):
        return [_scrub(v, values, named, path) for v in obj]
    if isinstance(obj, str):
        return redact_url(obj, values) if "://" in obj and " " not in obj else redact_text(obj, values)
    return obj


def _harmless(value: Any) -> bool:
    return value is None or isinstance(value, bool) or value == "" or value == REDACTED

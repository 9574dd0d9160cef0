"""The README and docs/ say what the code does: the commands they name exist, the example backend
is the installable one and runs, the environment variables documented are the ones the code
reads, the extras are the package's, the links resolve inside the repository and in the built
site, where a dead link fails the strict build."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
import yaml

import anysoftmax
from anysoftmax.cli import build_parser
from anysoftmax.testing.compare import compare_merge

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXAMPLE = ROOT / "examples" / "plugin"


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_readme_is_a_users_page():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README has {len(lines)} lines; the rest belongs in docs/"
    first = code_blocks(README, "bash")[0]
    assert README.index(first) < README.index("\n## "), "the two commands come before any section"
    commands = [line.split("#")[0].strip() for line in first.splitlines() if line.strip()]
    assert commands == ["bash run.sh matrix", "bash run.sh test"]
    assert README.index("anysoftmax is") < README.index(first), "one paragraph says what it is first"


def test_run_sh_and_ci_have_the_commands():
    run_sh = (ROOT / "run.sh").read_text()
    named = set(re.findall(r"bash run\.sh (\w+)", README + "".join(DOCS.values())))
    cases = set(re.findall(r"^\s+(\w+)\)\s+need=", run_sh, re.M))
    assert named <= cases and {"matrix", "test", "docs"} <= cases, (named, cases)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash run.sh test" in ci and "bash run.sh docs" in ci and "examples/plugin" in ci


def test_cli_commands_named_exist():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = README + "".join(DOCS.values())
    blocks = "".join(code_blocks(text, "bash"))
    named = set(re.findall(r"`anysoftmax ([a-z]+)", text)) | set(re.findall(r"^anysoftmax ([a-z]+)", blocks, re.M))
    assert named <= set(sub.choices), f"named but not commands: {sorted(named - set(sub.choices))}"


def test_extras_are_the_packages():
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    table = set(re.findall(r"^\| `(\w+)`", README, re.M)) | set(
        e for row in re.findall(r"^\| `(\w+)`, `(\w+)`", README, re.M) for e in row)
    assert extras <= table, f"extras missing from the README: {sorted(extras - table)}"
    install = DOCS["install.md"]
    assert all(f"`{e}`" in install for e in extras), [e for e in extras if f"`{e}`" not in install]
    run_sh = (ROOT / "run.sh").read_text()
    for needed in re.findall(r'need="([\w,]+)"', run_sh):
        assert set(needed.split(",")) <= extras, needed
    assert {"Homepage", "Documentation", "Changelog"} <= set(PYPROJECT["project"]["urls"])


def test_readme_example_is_the_installable_plugin():
    block = next(b for b in code_blocks(README, "python") if "class MyBackend" in b)
    assert block == (EXAMPLE / "my_pkg" / "backend.py").read_text()
    entry = re.search(r'`\[project\.entry-points\."anysoftmax\.backends"\] (mine = "[\w.:]+")`', README).group(1)
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert f'mine = "{meta["project"]["entry-points"]["anysoftmax.backends"]["mine"]}"' == entry
    assert "priority = -10" in block  # below torch (0): never the automatic choice


def test_readme_use_snippets_run():
    """The Use section's Python runs as written, given inputs of the names it uses."""
    blocks = [b for b in code_blocks(README, "python") if "class MyBackend" not in b]
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Softmax(-1))
    ns = dict(x=torch.randn(4, 8), model=model, batch=torch.randn(3, 8), d=24,
              scores=torch.randn(2, 3, 16, 24), pad=torch.rand(2, 1, 16, 24) < 0.2, sinks=torch.randn(3, 1, 1),
              v=torch.randn(24, 64), logits=torch.randn(4, 300) * 3, t=torch.tensor([0.7, 1.0, 1.3, 0.0]),
              seeds=torch.tensor([11, 12, 13, 14]), step=5)
    import importlib.util

    hf = importlib.util.find_spec("transformers") is not None  # (the hf extra; CI has it)
    # The sharded vocabulary runs on a one-rank gloo group: its shard is the whole row.
    ns.update(logits_shard=torch.randn(3, 50), tp_group=None)
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        for block in blocks:
            # from_pretrained would download a model: the line stops at its comment.
            lines = [line.split("#")[0] if "from_pretrained" in line else line for line in block.splitlines()]
            code = "\n".join(line for line in lines if hf or "integrations.transformers" not in line)
            exec(compile(code, "README", "exec"), ns)
    finally:
        torch.distributed.destroy_process_group()
    assert ns["p"].shape == ns["scores"].shape
    # Sampling: each drawn id is in its row's kept set; the seeded draw repeats; greedy at t = 0.
    ids, kept = ns["ids"], ns["kept"]
    assert bool((kept.gather(-1, ids[:, None]) > 0).all()) and int(ids[3]) == int(ns["logits"][3].argmax())
    again = anysoftmax.sampling.sample(ns["logits"], temperature=ns["t"], top_k=50, top_p=0.9, min_p=0.05,
                                       seed=ns["seeds"], offset=ns["step"])
    assert torch.equal(again, ids)
    z = (ns["logits"].double() / ns["t"].double().clamp_min(1e-30)[:, None]).log_softmax(-1)
    torch.testing.assert_close(ns["lp"][:3, 0].double(), z[:3].gather(-1, ids[:3, None])[:, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ns["probs"], torch.softmax(ns["logits_shard"], -1))
    # Softmax in pieces: the merge of the split attention is the unsplit one (float64 reference).
    scores64 = ns["scores"].double()
    unsplit = (torch.softmax(scores64, -1) @ ns["v"].double(), torch.logsumexp(scores64, -1))
    lses = [anysoftmax.logsumexp(s, -1) for s in ns["parts"]]
    merged = compare_merge(ns["out"], ns["lse"], ns["outs"], lses, expected=unsplit)
    assert merged.ok, merged.detail


def test_links_resolve_inside_the_repository():
    bad = []
    for name, text in [("README.md", README)] + [(f"docs/{n}", t) for n, t in DOCS.items()]:
        base = ROOT if name == "README.md" else ROOT / "docs"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                bad.append(f"{name}: link out of the repository: {target}")
                continue
            path = target.split("#")[0]
            if path and not (base / path).resolve().is_relative_to(ROOT):
                bad.append(f"{name}: {target} leaves the repository")
            elif path and not (base / path).exists():
                bad.append(f"{name}: {target} does not exist")
        if "/work/" in text or "/home/" in text:
            bad.append(f"{name}: names a path of some machine")
    assert not bad, "\n".join(bad)


def test_named_repository_paths_exist():
    text = README + "".join(DOCS.values())
    named = set(re.findall(r"`((?:anysoftmax|benchmarks|tests|examples|docs)/[\w./-]+?)`", text))
    missing = sorted(p for p in named if "<" not in p and "*" not in p and "{" not in p and not (ROOT / p).exists())
    assert not missing, f"paths named in the README or docs that do not exist: {missing}"


def _read_variables() -> set[str]:
    """Every ANYSOFTMAX_* name in the code that reads the environment: the package, run.sh, CI,
    the test setup and the GPU scripts."""
    files = [*(ROOT / "anysoftmax").rglob("*.py"), ROOT / "_anysoftmax_pytestplugin.py", ROOT / "run.sh",
             ROOT / ".ci" / "run", *(ROOT / "tests").rglob("*.py"), *(ROOT / "tests").rglob("*.sh"),
             *(ROOT / "benchmarks").glob("*.sh"), *(ROOT / "anysoftmax").rglob("*.yaml")]
    found = set()
    for f in files:
        found |= set(re.findall(r"ANYSOFTMAX_[A-Z0-9_]*[A-Z0-9]", f.read_text()))
    return found


def test_environment_variables_documented_are_the_ones_read():
    page = DOCS["environment.md"]
    documented = set(re.findall(r"^\| `(ANYSOFTMAX_[A-Z0-9_]+)` \|", page, re.M))
    read = _read_variables()
    assert read - documented == set(), f"read but not documented in docs/environment.md: {sorted(read - documented)}"
    assert documented - read == set(), f"documented but read nowhere: {sorted(documented - read)}"
    assert "`TRITON_INTERPRET`" in page


def test_yaml_reference_is_the_generated_one():
    from anysoftmax.matrix import keys

    assert keys.accepted() == keys.described(), "every key the schema accepts is described, and no other"
    assert keys.reference_markdown() in DOCS["matrix.md"], \
        "docs/matrix.md's YAML reference is stale: paste `python -m anysoftmax.matrix.keys`"


def test_every_docs_page_is_in_the_site():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [n for n in DOCS if f": {n}" not in nav] == []


def test_readme_backend_table_names_every_builtin_backend():
    names = {b.name for b in anysoftmax.list_backends() if b.name in ("torch", "triton", "triton_ascend", "wave",
                                                                         "cute")}
    section = README[README.index("## Backends"):README.index("## Add a backend")]
    assert all(f"| `{n}` |" in section for n in names)
    assert "never run on an AMD GPU" in section and "never run on an Ascend NPU" in section


# ---- the built site ---------------------------------------------------------------------------

def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site`, as `bash run.sh docs` runs it."""
    pytest.importorskip("mkdocs", reason="needs the docs extra (mkdocs), which `bash run.sh docs` installs")
    pytest.importorskip("material", reason="needs the docs extra (mkdocs-material)")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir",
                           str(site)], env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                          timeout=300)


class _Links(HTMLParser):
    """Every href and src of an HTML page."""

    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.targets += [value for name, value in attrs if name in ("href", "src") and value]


def test_every_link_of_the_built_site_resolves_in_it(tmp_path):
    site = tmp_path / "site"
    res = _mkdocs_build(ROOT / "mkdocs.yml", site)
    assert res.returncode == 0, res.stderr[-3000:]
    dead = []
    for page in site.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text())
        for target in parser.targets:
            path = target.split("#")[0].split("?")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            # (404.html links from the site's root: it is served at any depth)
            found = (site / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve()
            found = found / "index.html" if found.is_dir() else found
            if not (found.is_relative_to(site.resolve()) and found.is_file()):
                dead.append(f"{page.relative_to(site)}: {target}")
    assert not dead, f"{len(dead)} links of the built site lead nowhere in it:\n" + "\n".join(sorted(set(dead)))


def test_a_dead_link_fails_the_strict_build(tmp_path):
    """The site's own configuration (hooks, validation) on a page with one repository file that
    exists and one that does not: the build fails, naming only the missing one."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config = {"site_name": "t", "docs_dir": "docs", "validation": config["validation"],
              "hooks": [str(ROOT / hook) for hook in config.get("hooks", [])]}
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("[kept](../evidence.txt) and [dead](../results/missing.txt)\n")
    (tmp_path / "evidence.txt").write_text("measured\n")
    (tmp_path / "mkdocs.yml").write_text(json.dumps(config))  # JSON is YAML
    res = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0, res.stderr[-3000:]
    assert "missing.txt" in res.stderr and "evidence.txt" not in res.stderr, res.stderr[-3000:]


# ---- what the package tells its users -----------------------------------------------------------

def _message_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module that are not docstrings: what it prints, warns or raises."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_messages_point_to_what_a_wheel_user_has():
    """The wheel holds the package, not docs/ or requirements files: a message that sends its
    reader there sends a wheel user nowhere. (Docstrings and comments, read in a clone, may.)"""
    bad = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in sorted((ROOT / "anysoftmax").rglob("*.py"))
           for line, text in _message_strings(p) if re.search(r"\bdocs/\w+\.md|requirements-\w+\.txt", text)]
    assert not bad, "\n".join(bad)


def test_the_ascend_install_order_is_in_the_message_itself():
    from anysoftmax.backends.triton_ascend import npu

    reason = npu.missing_reason()
    if reason is None:
        pytest.skip("an Ascend NPU stack is installed here: nothing is missing")
    assert "triton-ascend==3.2.0" in reason and "torch-npu==2.7.1" in reason and "set_env.sh" in reason, reason

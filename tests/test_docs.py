"""The documentation site builds, and every code block in it runs.

What is checked:

* ``mkdocs build --strict`` succeeds (a broken link, a page missing from ``nav`` or a page
  in ``nav`` that does not exist fails it);
* every fenced code block of README.md and docs/*.md, one test per block, named
  ``PAGE:LINE`` (the line of the block's first code line), so a failure names the block;
* the configuration reference (docs/configuration.md) names every ``CHRONICA_*`` (and
  every other) environment variable chronica reads, every parameter of every public
  constructor and function, and every flag of ``chronica coordinator``.

How code blocks run (the convention a docs author follows):

* ```` ```python ```` blocks run in page order. All blocks of one page share one namespace,
  in a fresh Python process per page (so TensorFlow, JAX and torch state never leak
  between pages or into other tests); its current directory is a fresh temporary
  directory, the same for the page's python and sh blocks. If a block fails, the page's
  later blocks are reported as not run.
* A page whose code is one program launched the way the page says (``torchrun``, two
  ``TF_CONFIG`` workers, ``accelerate launch``, ``python file.py``) names that program once,
  anywhere in the page::

      <!-- doc-script: train.py -->

  Then its python blocks are not run one by one: they are written, in page order, to
  ``train.py`` in the page's directory (what a reader who pastes every block gets), and
  the page's sh blocks run as shown, launching it. A python block reports the result of
  the first sh block after it that names the program; a failure names the lines of the
  program each block became. Such a page has no hidden set-up: whatever it needs is on
  the page. ``LAUNCHES`` below lists how every page runs.
* A block may be preceded (blank lines between are fine) by a hidden setup comment, which
  the site does not show (pages that are not scripts only; they are being moved to
  scripts)::

      <!-- doc-setup: FLAGS
      code run before the block: Python for a python block, bash for an sh block
      -->

  ``FLAGS`` (optional, comma-separated) are:
  ``gloo``: before the block, start a real single-process ``torch.distributed`` group
  (backend gloo, world size 1, rank 0, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT=0``: the OS
  picks the store's port) unless one is running; it is destroyed when the page ends.
  ``file=NAME`` (python): do not run the block, write it to ``NAME`` in the page's
  directory for a later sh block to launch (e.g. with ``torchrun``); it is compiled here.
  ``serve`` (sh): the command serves until stopped; it passes once it prints its first
  line and is then interrupted (SIGINT).
* ```` ```sh ```` (or ``bash``) blocks run with ``bash -e`` in the page's directory, with
  this interpreter's ``bin`` first on ``PATH`` (so ``chronica``, ``torchrun`` and
  ``python`` are the test environment's), ``PYTHONPATH`` the repository root, and
  ``CHRONICA_PORT`` a free port whose successor is free too (so nothing the docs start
  collides with a real service). A block is skipped, with its reason, when it matches
  ``SKIP_SH`` below; that list is the only way to skip one.
* ```` ```diff ````, ```` ```text ```` and unlabeled fences are not executed; any other
  language is an error (add it to ``NOT_RUN`` if it is documentation only).
* A page's blocks that need a framework that is not installed are skipped (as the rest of
  the suite does with ``pytest.importorskip``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
from workers import scaled

from chronica.core import ScheduleConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG_PAGE = DOCS / "configuration.md"

RUN = {"python", "sh", "bash"}
NOT_RUN = {"", "diff", "text", "console", "json", "yaml", "toml", "ini"}
FLAGS = {"gloo", "serve"}

# sh blocks that are not run, by a regular expression searched in the block: why.
SKIP_SH: dict[str, str] = {
    r"\bpip install\b": "installs packages (network access, changes the environment); CI "
    "installs the same extras before it runs the tests",
    r"\bpython -m pytest\b": "runs the whole test suite, which includes this test",
    r"\bchronica bench\b|\bpython -m benchmarks\b": "the full benchmark takes many minutes "
    "and rewrites docs/benchmarks.md",
    r"\bsudo\b": "needs root (network namespaces for the gradient benchmark)",
    r"\bchronica demo\b": "real 2-process trainings that take minutes at full size; "
    "tests/test_demo.py runs the demo's quick configuration",
    r"--rdzv-endpoint|--node-rank|--nnodes[ =]2": "a launch across several hosts",
}

# Frameworks a page needs, by a pattern in its code: the module that must be importable.
NEEDS = {
    r"\btorch\b": "torch",
    r"\btensorflow\b|\bchronica\.tf\b|\bkeras\b": "tensorflow",
    r"\bjax\b|\bchronica\.jax\b": "jax",
    r"\boptax\b": "optax",
    r"\bflax\b": "flax",
    r"\bgrain\b": "grain",
    r"\blightning\b": "lightning",
    r"\btransformers\b|\bchronica\.torch\.hf\b": "transformers",
    r"\baccelerate\b": "accelerate",
    r"\bdatasets\b": "datasets",
    r"\btorchdata\b": "torchdata",
}

# Limits on a quiet machine, scaled by the load when a page starts (they catch hangs, and a
# page of TensorFlow blocks took over 240 s on these 2 cores while other jobs ran).
PAGE_TIMEOUT = 240  # seconds for all blocks of one page
SH_TIMEOUT = 180  # seconds for one sh block (a launch of a page's program included)


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # first code line, 1-based
    lang: str
    code: str
    flags: list[str] = field(default_factory=list)
    file: str | None = None
    setup: str = ""
    setup_line: int = 0
    skip: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


_FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")
_SETUP = re.compile(r"^\s*<!--\s*doc-setup\b:?(.*)$")
_SCRIPT = re.compile(r"^\s*<!--\s*doc-script:\s*([\w.-]+\.py)\s*-->\s*$", re.MULTILINE)


def script_of(path: Path) -> str | None:
    """The program a page's python blocks make up (``<!-- doc-script: NAME -->``), if any."""
    found = _SCRIPT.findall(path.read_text(encoding="utf-8"))
    return found[0] if found else None


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """Every fenced block of ``path`` and the problems found (orphan setups, bad flags)."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: tuple[int, list[str], list[str]] | None = None  # (line, flags, code lines)
    i = 0
    while i < len(lines):
        text = lines[i]
        setup = _SETUP.match(text)
        fence = _FENCE.match(text)
        if setup:
            if pending is not None:
                problems.append(f"{page}:{pending[0]}: doc-setup not followed by a code block")
            start = i + 1
            first = setup.group(1)
            body: list[str] = []
            closed = first.rstrip().endswith("-->")
            if closed:
                first = first.rstrip()[:-3]
            while not closed:
                i += 1
                if i == len(lines):
                    problems.append(f"{page}:{start}: doc-setup comment is not closed")
                    break
                if lines[i].strip().endswith("-->"):
                    closed = True
                    rest = lines[i].rstrip()[:-3]
                    if rest.strip():
                        body.append(rest)
                else:
                    body.append(lines[i])
            flags = [f.strip() for f in first.split(",") if f.strip()]
            pending = (start + 1, flags, body)
        elif fence:
            indent, lang = fence.group(1), fence.group(2).lower()
            start = i + 1
            code: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                code.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            block = Block(page, start + 1, lang, "\n".join(code) + "\n")
            if pending is not None:
                setup_line, flags, body = pending
                block.setup_line = setup_line
                block.setup = "\n".join(body) + "\n" if body else ""
                for flag in flags:
                    if flag.startswith("file="):
                        block.file = flag[5:]
                    elif flag in FLAGS:
                        block.flags.append(flag)
                    else:
                        problems.append(f"{page}:{setup_line - 1}: unknown doc-setup flag {flag!r}")
                pending = None
            if lang not in RUN | NOT_RUN:
                problems.append(f"{block.id}: unknown code block language {lang!r}")
            if lang in RUN:
                blocks.append(block)
        elif text.strip() and pending is not None:
            problems.append(f"{page}:{pending[0] - 1}: doc-setup not followed by a code block")
            pending = None
        i += 1
    if pending is not None:
        problems.append(f"{page}:{pending[0] - 1}: doc-setup not followed by a code block")
    return blocks, problems


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _classify(block: Block) -> Block:
    if block.lang in ("sh", "bash"):
        for pattern, reason in SKIP_SH.items():
            if re.search(pattern, block.code):
                block.skip = reason
                break
    return block


PARSED = {str(p.relative_to(ROOT)): parse(p) for p in _pages()}
BLOCKS = [_classify(b) for blocks, _ in PARSED.values() for b in blocks]
SCRIPTS = {str(p.relative_to(ROOT)): script_of(p) for p in _pages()}


def _launch(page: str) -> str:
    """How the docs test runs ``page``'s code (the report in ``LAUNCHES``)."""
    script = SCRIPTS[page]
    blocks = [b for b in BLOCKS if b.page == page]
    if script is None:
        runs = [b for b in blocks if b.lang == "python"]
        return "python blocks in one interpreter, in page order" if runs else "sh blocks only"
    launches = [
        re.sub(r"\\\n\s*", "", b.code).strip().splitlines()  # continuation lines joined
        for b in blocks
        if b.lang != "python" and script in b.code and not b.skip
    ]
    lines = [line.strip() for launch in launches for line in launch if script in line]
    return f"{script}: " + "; ".join(lines)


LAUNCHES = {page: _launch(page) for page in PARSED}


# -- the per-page runner (a fresh interpreter per page) -------------------------------------

RUNNER = r"""
import json, os, signal, subprocess, sys, time, traceback

from chronica.comm.ports import free_port

spec = json.load(sys.stdin)
results = []
namespace = {"__name__": "__doc_page__"}
failed = None
gloo = False


def padded(code, line):
    return "\n" * (line - 1) + code


def compiled(code, line):
    # The page's own path as file name: tracebacks name its lines, and inspect.getsource
    # (which TensorFlow's AutoGraph needs) reads the code from the page.
    return compile(padded(code, line), spec["path"], "exec")


def clipped(text, head=2500, tail=4000):
    # Two workers of a page fail together: the first error is at the head, the last at the tail.
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


def run_sh(block):
    env = dict(os.environ)
    env["CHRONICA_PORT"] = str(free_port(2))
    script = block["setup"] + block["code"]
    if "serve" in block["flags"]:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        first = proc.stdout.readline()
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            rest, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rest, _ = proc.communicate()
        if not first or proc.returncode not in (0, -signal.SIGINT, 130):
            raise RuntimeError(clipped(f"exit {proc.returncode}; output:\n{first}{rest}"))
        return first + rest
    done = subprocess.run(
        ["bash", "-e", "-c", script], env=env, capture_output=True, text=True,
        timeout=spec["sh_timeout"],
    )
    if done.returncode:
        raise RuntimeError(clipped(f"exit {done.returncode}:\n{done.stdout}{done.stderr}"))
    return done.stdout


script = spec["script"]
if script:
    # The page's program: every python block, in page order, as a reader pastes them.
    with open(script, "w", encoding="utf-8") as f:
        f.write("\n\n".join(b["code"].rstrip() for b in spec["blocks"] if b["lang"] == "python"))
        f.write("\n")

for block in spec["blocks"]:
    where = f"{block['page']}:{block['line']}"
    if script and block["lang"] == "python":
        try:
            compiled(block["code"], block["line"])
            results.append({"status": "part", "message": ""})
        except BaseException:
            failed = where
            results.append({"status": "fail", "message": traceback.format_exc()[-6000:]})
        continue
    if block["skip"]:
        results.append({"status": "skip", "message": block["skip"]})
        continue
    if failed is not None:
        results.append({"status": "fail", "message": f"not run: the block at {failed} failed"})
        continue
    started = time.perf_counter()
    try:
        if block["lang"] == "python":
            if "gloo" in block["flags"] and not gloo:
                import torch.distributed as dist

                # One rank hosts its own store: port 0 lets the OS pick a free one.
                os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
                dist.init_process_group("gloo", rank=0, world_size=1)
                gloo = True
            if block["setup"]:
                exec(compiled(block["setup"], block["setup_line"]), namespace)
            program = compiled(block["code"], block["line"])
            if block["file"]:
                with open(block["file"], "w", encoding="utf-8") as f:
                    f.write(block["code"])
            else:
                exec(program, namespace)
            output = ""
        else:
            output = run_sh(block)
        results.append({"status": "ok", "seconds": time.perf_counter() - started,
                        "message": output[-2000:]})
    except BaseException:
        failed = where
        results.append({"status": "fail", "message": traceback.format_exc()[-9000:]})
    sys.stdout.flush()

try:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
except ImportError:
    pass
with open(spec["results"], "w", encoding="utf-8") as f:
    json.dump(results, f)
"""


def _missing_framework(blocks: list[Block]) -> str | None:
    code = "\n".join(b.setup + b.code for b in blocks if b.lang == "python")
    for pattern, module in NEEDS.items():
        if re.search(pattern, code) and importlib.util.find_spec(module) is None:
            return module
    return None


def _run_page(page: str) -> list[dict]:
    blocks = [b for b in BLOCKS if b.page == page]
    if all(b.skip for b in blocks):
        return [{"status": "skip", "message": b.skip} for b in blocks]
    missing = _missing_framework(blocks)
    if missing:
        return [{"status": "skip", "message": f"{missing} is not installed"} for _ in blocks]
    with tempfile.TemporaryDirectory(prefix="chronica-docs-") as tmp:
        results_path = Path(tmp) / ".results.json"
        spec = {
            "blocks": [asdict(b) for b in blocks],
            "results": str(results_path),
            "path": str(ROOT / page),
            "sh_timeout": scaled(SH_TIMEOUT),
            "script": SCRIPTS[page],
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONICA_")}
        env.pop("MASTER_ADDR", None)
        env.pop("MASTER_PORT", None)
        env.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=str(ROOT),
            TF_CPP_MIN_LOG_LEVEL="2",
            JAX_PLATFORMS="cpu",
            PYTHONUNBUFFERED="1",
        )
        done = subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=json.dumps(spec),
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(PAGE_TIMEOUT),
        )
        if not results_path.exists():
            tail = (done.stdout + done.stderr)[-6000:]
            message = f"the page's process ended with {done.returncode} before reporting:\n{tail}"
            return [{"status": "fail", "message": message} for _ in blocks]
        results = json.loads(results_path.read_text())
        if SCRIPTS[page]:
            _script_results(blocks, results, SCRIPTS[page])
        if any(r["status"] == "fail" for r in results):
            tail = (done.stdout + done.stderr)[-3000:]
            for r in results:
                if r["status"] == "fail":
                    r["message"] += f"\n--- the page's output (tail) ---\n{tail}"
        return results


def _script_results(blocks: list[Block], results: list[dict], script: str) -> None:
    """Give every python block of a script page the result of the first sh block after it
    that launches the program, with the program's lines it became."""
    line, where = 1, []
    for block in blocks:
        if block.lang == "python":
            count = block.code.rstrip().count("\n") + 1
            where.append(f"{script} lines {line}-{line + count - 1}: {block.id}")
            line += count + 2
    table = "\n".join(where)
    for i, (block, result) in enumerate(zip(blocks, results, strict=True)):
        if result["status"] != "part":
            continue
        launch = next(
            (
                (later, results[j])
                for j, later in enumerate(blocks[i + 1 :], start=i + 1)
                if later.lang != "python" and script in later.code and not later.skip
            ),
            None,
        )
        if launch is None:
            result.update(status="fail", message=f"no sh block after {block.id} runs {script}")
            continue
        later, outcome = launch
        result["status"] = "ok" if outcome["status"] == "ok" else outcome["status"]
        result["message"] = f"part of {script}, run by {later.id}"
        if outcome["status"] == "fail":
            result["message"] += f":\n{outcome['message']}\n{table}"
            outcome["message"] += f"\n{table}"


# Pages run two at a time (CI has 2 cores), in the order the tests ask for them, started by
# the first test of this file so that they run while the site builds and the reference is
# checked.
_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_FUTURES: dict[str, concurrent.futures.Future] = {}
_LOCK = threading.Lock()


def _start_pages(session: pytest.Session) -> None:
    """Start the pages of the code block tests this session runs (only those: a run of one
    page's tests runs that page alone)."""
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2)
            chosen = {
                item.callspec.params["block"].page
                for item in session.items
                if getattr(item, "originalname", None) == "test_code_block_runs"
            }
            for p in dict.fromkeys(b.page for b in BLOCKS if b.page in chosen):
                _FUTURES[p] = _POOL.submit(_run_page, p)


def _page_results(page: str, session: pytest.Session) -> list[dict]:
    _start_pages(session)
    return _FUTURES[page].result()


# -- the site builds ----------------------------------------------------------------------------


def test_mkdocs_build_strict(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _start_pages(request.session)  # the code blocks' pages run in the background meanwhile
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[dev]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").is_file()


def test_every_docs_page_is_in_the_nav() -> None:
    """Also enforced by ``validation: omitted_files: warn`` in mkdocs.yml; this names the
    missing pages directly and survives that setting being dropped."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", text, flags=re.MULTILINE))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages <= listed, f"pages missing from mkdocs.yml nav: {sorted(pages - listed)}"


# -- the configuration reference is complete ------------------------------------------------

PUBLIC_MODULES = (
    "chronica",
    "chronica.torch.utils.data",
    "chronica.torch.distributed",
    "chronica.torch.hf",
    "chronica.tf",
    "chronica.jax",
)
# Public names that take no configuration: results handed back to the user.
NOT_CONFIGURATION = {
    **{f"chronica.{m}": "a submodule" for m in ("jax", "runtime", "tf", "torch")},
    "chronica.EpochPlan": "a plan the scheduler returns",
    "chronica.PlanStats": "diagnostics the scheduler returns",
    "chronica.jax.ReducedLeaves": "what ScheduledReducer.iterate yields",
    "chronica.jax.PerLeaf": "what per_leaf returns",
    "chronica.torch.utils.data.Dataset": "a base class without arguments",
}
# Reachable configuration objects outside those modules' __all__.
EXTRA = ("chronica.core.controller.ControllerOptions",)


def _config_text() -> str:
    return CONFIG_PAGE.read_text(encoding="utf-8")


def _public_callables() -> list[str]:
    names = []
    for module in PUBLIC_MODULES:
        names += [f"{module}.{n}" for n in _public_names(module)]
    return [n for n in names if n not in NOT_CONFIGURATION] + list(EXTRA)


def _public_names(module: str) -> list[str]:
    # Read __all__ without importing the frameworks at collection time.
    text = _module_file(module).read_text(encoding="utf-8")
    match = re.search(r"__all__ = \[(.*?)\]", text, flags=re.DOTALL)
    assert match, f"{module} has no __all__"
    return [n for n in re.findall(r'"(\w+)"', match.group(1)) if not n.startswith("__")]


def _module_file(module: str) -> Path:
    path = ROOT / (module.replace(".", "/") + ".py")
    return path if path.exists() else ROOT / module.replace(".", "/") / "__init__.py"


def _section(text: str, name: str, quoted: bool = True) -> str | None:
    """The part of the page under the first heading that names ``name`` (in backticks when
    ``quoted``), down to the next heading of the same or a higher level."""
    lines = text.splitlines()
    needle = f"`{name}`" if quoted else name
    for i, line in enumerate(lines):
        heading = re.match(r"^(#+)\s", line)
        if heading and needle in line:
            level = len(heading.group(1))
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if (m := re.match(r"^(#+)\s", lines[j])) and len(m.group(1)) <= level
                ),
                len(lines),
            )
            return "\n".join(lines[i:end])
    return None


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    for framework in ("torch", "tf", "jax"):
        if (
            f".{framework}" in module + "."
            and importlib.util.find_spec({"tf": "tensorflow"}.get(framework, framework)) is None
        ):
            pytest.skip(f"{framework} is not installed")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as missing:  # an integration's extra is not installed
        if (missing.name or "chronica").partition(".")[0] == "chronica":
            raise
        pytest.skip(f"{missing.name} is not installed")


@pytest.mark.parametrize("dotted", _public_callables())
def test_configuration_page_lists_every_parameter(dotted: str) -> None:
    obj = _resolve(dotted)
    assert callable(obj), dotted
    section = _section(_config_text(), dotted)
    assert section is not None, (
        f"docs/configuration.md has no heading naming `{dotted}`; add a section with a table "
        "of its parameters"
    )
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = [
        p.name
        for p in inspect.signature(target).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    # A face's plan options are documented once, in the section of ScheduleConfig.
    plan_section = _section(_config_text(), "chronica.ScheduleConfig") or ""
    options = set(ScheduleConfig.option_names())
    missing = [
        p
        for p in params
        if f"`{p}`" not in section and not (p in options and f"`{p}`" in plan_section)
    ]
    assert not missing, f"docs/configuration.md, section `{dotted}`, lacks {missing}"


@pytest.mark.parametrize("dotted", _public_callables())
def test_every_public_callable_documents_each_argument_and_shows_an_example(dotted: str) -> None:
    obj = _resolve(dotted)
    doc = inspect.getdoc(obj) or ""
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = [
        p.name
        for p in inspect.signature(target).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    # One line per argument (``name:`` or, for a pair, ``name, other:``) and an example.
    missing = [p for p in params if not re.search(rf"^\s*(\w+, )?{p}[:,]", doc, re.M)]
    assert not missing, f"{dotted}'s docstring has no Args: line for {missing}"
    assert "Example" in doc or ">>>" in doc, f"{dotted}'s docstring shows no example"


def _environment_variables() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "chronica").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found |= set(re.findall(r"\bCHRONICA_[A-Z0-9_]*[A-Z0-9]\b", text))
        found |= set(re.findall(r"(?:environ\.get|getenv|environ\[)\(?\s*[\"']([A-Z0-9_]+)", text))
    return found


def test_environment_variables_are_found() -> None:
    assert {"CHRONICA_PORT", "CHRONICA_CURVE_DIR", "MASTER_ADDR"} <= _environment_variables()


@pytest.mark.parametrize("name", sorted(_environment_variables()))
def test_configuration_page_lists_every_environment_variable(name: str) -> None:
    section = _section(_config_text(), "Environment variables", quoted=False)
    assert section is not None, "docs/configuration.md needs a heading 'Environment variables'"
    assert f"`{name}`" in section, f"{name} is read in chronica/ but not documented"


def test_configuration_page_lists_every_coordinator_flag() -> None:
    from chronica.comm.standalone import build_parser

    section = _section(_config_text(), "chronica coordinator")
    assert section is not None, "docs/configuration.md needs a heading `chronica coordinator`"
    flags = [
        option
        for action in build_parser()._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
        if option.startswith("--")
    ]
    missing = [f for f in flags if f"`{f}" not in section]
    assert not missing, f"docs/configuration.md, `chronica coordinator`, lacks {missing}"


# -- every code block runs -------------------------------------------------------------------


# No limit of its own beyond the suite's: it waits for its page, which may queue behind others
# that each have a scaled limit.
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_code_block_runs(block: Block, request: pytest.FixtureRequest) -> None:
    results = _page_results(block.page, request.session)
    index = [b for b in BLOCKS if b.page == block.page].index(block)
    result = results[index]
    if result["status"] == "skip":
        pytest.skip(result["message"])
    assert result["status"] == "ok", f"{block.id} ({block.lang}) failed:\n{result['message']}"


def test_code_blocks_follow_the_convention() -> None:
    problems = [p for _, found in PARSED.values() for p in found]
    for page, script in SCRIPTS.items():
        hidden = [b.id for b in BLOCKS if b.page == page and (b.setup or b.flags or b.file)]
        if script and hidden:
            problems.append(f"{page} is the program {script}: no hidden set-up ({hidden})")
    for b in BLOCKS:
        if b.file and b.lang != "python":
            problems.append(f"{b.id}: file= applies to python blocks")
        if "serve" in b.flags and b.lang == "python":
            problems.append(f"{b.id}: serve applies to sh blocks")
    assert not problems, "\n".join(problems)

"""One reader of sizes files (``chronica.sizes_io``): ``chronica simulate --sizes``,
``chronica coordinator --sizes`` and ``chronica demo --lengths`` accept the same files and
fail the same way, with a ``ValueError`` that names the flag, the file and the fix."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chronica import sizes_io
from chronica.comm.standalone import _load_sizes
from chronica.sim import read_sizes as simulate_read_sizes

VALUES = np.array([3.0, 1.0, 4.0, 1.0, 5.0])


@pytest.fixture
def files(tmp_path):
    np.save(tmp_path / "s.npy", VALUES)
    np.save(tmp_path / "ints.npy", VALUES.astype(np.int32))
    (tmp_path / "s.txt").write_text("# sizes\n3\n1\n\n4\n1  # one\n5\n")
    (tmp_path / "s.csv").write_text(
        "id, tokens\n" + "".join(f"{i},{v:g}\n" for i, v in enumerate(VALUES))
    )
    return tmp_path


@pytest.mark.parametrize(
    ("name", "column"), [("s.npy", None), ("ints.npy", None), ("s.txt", None), ("s.csv", "tokens")]
)
def test_coordinator_and_simulate_read_the_same_sizes(files, name, column) -> None:
    path = files / name
    np.testing.assert_array_equal(sizes_io.read_sizes(path, column), VALUES)
    np.testing.assert_array_equal(simulate_read_sizes(path, column), VALUES)
    np.testing.assert_array_equal(_load_sizes(path, column), VALUES)


@pytest.mark.parametrize(
    ("content", "column", "message"),
    [
        ("", None, r"--sizes s\.txt: no sizes found; give one number per sample"),
        ("\n  \n# only a comment\n", None, r"--sizes s\.txt: no sizes found"),
        ("3\nabc\n", None, r"--sizes s\.txt:2: 'abc' is not a number; write one size per line"),
        ("3\n", "tokens", r"--column 'tokens' only applies to \.csv"),
        ("3\n" + "7" * 5000 + "\n", None, r"--sizes s\.txt:2: not a line of text \(over 4096"),
        ("3\n\0\0\0\n", None, r"--sizes s\.txt:2: not a line of text .*NUL bytes"),
    ],
)
def test_bad_text_files_name_the_file_and_the_fix(tmp_path, content, column, message) -> None:
    (tmp_path / "s.txt").write_text(content)
    for read in (sizes_io.read_sizes, simulate_read_sizes, _load_sizes):
        with pytest.raises(ValueError, match=message):
            read(tmp_path / "s.txt", column)


def test_bad_tables_and_arrays(tmp_path) -> None:
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ValueError, match=r"--sizes e\.csv is empty; write a header"):
        sizes_io.read_sizes(tmp_path / "e.csv", "tokens")
    (tmp_path / "h.csv").write_text("tokens,other\n")
    with pytest.raises(ValueError, match=r"--sizes h\.csv --column tokens: no sizes found"):
        sizes_io.read_sizes(tmp_path / "h.csv", "tokens")
    with pytest.raises(ValueError, match=r"--column NAME \(its columns: \['tokens', 'other'\]\)"):
        sizes_io.read_sizes(tmp_path / "h.csv")
    (tmp_path / "x.csv").write_text("tokens\n3\n\n")
    with pytest.raises(ValueError, match=r"line 3, --column tokens: '' is not a number"):
        sizes_io.read_sizes(tmp_path / "x.csv", "tokens")
    np.save(tmp_path / "2d.npy", np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"shape \(2, 2\); save a 1-D array"):
        sizes_io.read_sizes(tmp_path / "2d.npy")
    np.save(tmp_path / "empty.npy", np.array([]))
    with pytest.raises(ValueError, match=r"--sizes empty\.npy: no sizes found"):
        sizes_io.read_sizes(tmp_path / "empty.npy")
    np.save(tmp_path / "str.npy", np.array(["a", "b"]))
    with pytest.raises(ValueError, match=r"holds <U1 values; save a numeric 1-D array"):
        sizes_io.read_sizes(tmp_path / "str.npy")
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(ValueError, match=r"--sizes bad\.npy is not a readable \.npy file"):
        sizes_io.read_sizes(tmp_path / "bad.npy")
    with pytest.raises(ValueError, match=r"--sizes '.*none\.txt': no such file"):
        sizes_io.read_sizes(tmp_path / "none.txt")


def test_values_are_validated_by_the_callers_naming_the_file(tmp_path) -> None:
    (tmp_path / "s.txt").write_text("3\n-1\n")
    np.testing.assert_array_equal(sizes_io.read_sizes(tmp_path / "s.txt"), [3, -1])  # reads
    for read in (simulate_read_sizes, _load_sizes):
        with pytest.raises(ValueError, match=r"--sizes s\.txt\[1\] is .*non-negative"):
            read(tmp_path / "s.txt", None)


def test_sizes_io_is_a_leaf() -> None:
    """It imports numpy and the standard library only (pyarrow lazily), no chronica module."""
    tree = ast.parse(Path(sizes_io.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "csv", "os", "pathlib", "numpy", "pyarrow"}


def test_coordinator_command_reports_a_bad_sizes_file(tmp_path) -> None:
    (tmp_path / "s.csv").write_text("tokens\n3\n")
    command = [
        sys.executable,
        "-m",
        "chronica.cli",
        "coordinator",
        "--sizes",
        str(tmp_path / "s.csv"),
    ]
    run = subprocess.run(
        [*command, "--world", "1", "--batch-size", "1"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    assert "chronica coordinator: --sizes s.csv is a table: name the column with --column NAME" in (
        run.stderr
    )


def test_a_huge_sparse_file_is_refused_at_its_first_line(tmp_path) -> None:
    """A 1 GiB file of zero bytes (sparse: no disk used) is refused after one bounded read,
    not loaded whole."""
    path = tmp_path / "s.txt"
    with path.open("wb") as f:
        f.truncate(1 << 30)
    with pytest.raises(ValueError, match=r"s\.txt:1: not a line of text"):
        sizes_io.read_sizes(path)

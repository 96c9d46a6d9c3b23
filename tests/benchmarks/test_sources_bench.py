"""The sources benchmark writes every format with the same documents in the same shards,
and its readers all count the same samples and tokens (what its timing assumes)."""

from __future__ import annotations

import numpy as np

from benchmarks import sources


def test_every_reader_reads_the_same_samples_and_tokens(tmp_path):
    docs = sources._documents(60)
    shards = [docs[i::3] for i in range(3)]
    files = sources._write_all(tmp_path, shards)
    expected = (60, int(sum(len(d) for d in docs)))
    readers = sources._readers(tmp_path, files)
    ran = {name: reader["read"]() for name, reader in readers.items() if "read" in reader}
    assert "chronica MDSSource" in ran and "chronica WebDatasetSource" in ran
    assert set(ran.values()) == {expected}
    for source in sources._random_readers(tmp_path, files).values():
        assert sources._random_read(source, seed=0) == expected


def test_the_page_section_names_what_did_not_run():
    row = {"format": "MDS", "package": True}
    result = {
        "samples": 10,
        "shards": 2,
        "tokens": 100,
        "repeats": 1,
        "bytes": {"MDS": 1, "parquet": 1, "jsonl": 1, "WebDataset": 1},
        "versions": {"datasets": "5"},
        "sequential": [
            {**row, "reader": "mosaic", "error": "ImportError('x')"},
            {**row, "reader": "ours", "package": False, "samples_per_s": 5.0, "seconds": [2, 3]},
        ],
        "random": [{"reader": "ours", "samples_per_s": np.float64(3.0), "seconds": [3.0]}],
        "load_average": [1.0, 2.0],
        "machine": {"cpu_count": 2},
    }
    page = sources.render_markdown(result, img_dir=None)
    assert page.startswith("## Stream sources") and "Not run here: mosaic" in page
    assert "python -m benchmarks --only sources" in page
    assert "| 3–5 |" in page and "load average 1.0 before" in page
    assert "not run" in sources.format_table(result)

"""chronica.comm.standalone (``chronica coordinator``): its arguments are checked before
anything listens, errors end the command with a message and no traceback, and
``--make-keys`` writes a key folder. Serving over the network is in test_security.py."""

import numpy as np
import pytest

from chronica.comm.auth import CurveServer
from chronica.comm.standalone import build_parser, main


def test_the_parser_follows_the_samplers_arguments():
    args = build_parser().parse_args(["--sizes", "s.npy", "--world", "8", "--batch-size", "64"])
    assert (args.world, args.batch_size, args.window, args.seed) == (8, 64, 16, 0)
    assert (args.shuffle, args.cost, args.host, args.port) == ("global", "linear", None, None)
    assert not args.drop_last and not args.variable_batch


@pytest.mark.parametrize(
    "argv, missing",
    [
        ([], "--sizes, --world, --batch-size"),
        (["--sizes", "s.npy"], "--world, --batch-size"),
        (["--sizes", "s.npy", "--world", "2"], "--batch-size"),
    ],
)
def test_required_arguments_are_named(argv, missing, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"the following arguments are required: {missing}" in capsys.readouterr().err


def test_a_sizes_file_that_cannot_be_read_ends_without_a_traceback(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["--sizes", str(tmp_path / "missing.npy"), "--world", "2", "--batch-size", "8"])
    message = str(exit_.value.code)
    assert message.startswith("chronica coordinator: ") and "missing.npy" in message


@pytest.mark.parametrize(
    "extra, names",
    [
        (["--world", "0", "--batch-size", "8"], "num_replicas"),
        (["--world", "2", "--batch-size", "8", "--cost", "cubic"], "cost"),
    ],
)
def test_bad_sampler_arguments_end_with_a_message_naming_them(tmp_path, extra, names):
    # (Arguments checked by the coordinator itself, such as --port, come after the command
    # takes over SIGINT and SIGTERM: test_security.py runs the command in a process.)
    sizes = tmp_path / "sizes.npy"
    np.save(sizes, np.arange(1, 65))
    with pytest.raises(SystemExit) as exit_:
        main(["--sizes", str(sizes), *extra])
    message = str(exit_.value.code)
    assert message.startswith("chronica coordinator: ") and names in message


def test_make_keys_writes_a_folder_and_says_how_to_use_it(tmp_path, capsys):
    folder = tmp_path / "keys"
    assert main(["--make-keys", str(folder)]) == 0
    said = capsys.readouterr().out
    assert f"CHRONICA_CURVE_DIR={folder}" in said
    assert CurveServer.from_env({"CHRONICA_CURVE_DIR": str(folder)}) is not None
    with pytest.raises(SystemExit) as exit_:
        main(["--make-keys", str(folder)])  # keys are never replaced
    assert "exists" in str(exit_.value.code)

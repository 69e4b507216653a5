"""Numbers on the command line (issue 31, item 13): a value a flag does not take gets
argparse's usage message and exit 2, a size the definition cannot take a located
argument error and exit 1; never a Python traceback. (Negative or huge --sizes, a
negative --seed, a --tile that is not numbers, `demo --size -1` and `--time-limit nan`
all ended in NumPy's or the executor's tracebacks.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tclang as tc
from tclang.cli import main

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "mm.tc"
    path.write_text(MM)
    return str(path)


USAGE = [  # (arguments after the file, the flag named)
    ("run", ["--sizes", "M=2,N=2,K=2", "--seed", "-1"], "--seed"),
    ("run", ["--sizes", "M=2,N=2,K=2", "--repeat", "0"], "--repeat"),
    ("run", ["--sizes", "M=2,N=2,K=2", "--tile", "x"], "--tile"),
    ("explain", ["--sizes", "M=2,N=2,K=2", "--tile", "32,,32"], "--tile"),
    ("tune", ["--sizes", "M=2,N=2,K=2", "--time-limit", "nan"], "--time-limit"),
    ("tune", ["--sizes", "M=2,N=2,K=2", "--time-limit", "-1"], "--time-limit"),
    ("tune", ["--sizes", "M=2,N=2,K=2", "--budget", "0"], "--budget"),
    ("tune", ["--sizes", "M=2,N=2,K=2", "--jobs", "0"], "--jobs"),
    ("compare", ["--sizes", "M=2,N=2,K=2", "--rounds", "0"], "--rounds"),
    ("compare", ["--sizes", "M=2,N=2,K=2", "--tune", "-2"], "--tune"),
]


@pytest.mark.parametrize("command,extra,flag", USAGE, ids=[f"{c}{f}={e[-1]}"
                                                           for c, e, f in USAGE])
def test_a_bad_number_gets_the_usage_message(source, capsys, command, extra, flag):
    with pytest.raises(SystemExit) as info:
        main([command, source, *extra])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"argument {flag}: expected" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("extra,flag", [
    (["demo", "--size", "-1"], "--size"), (["fuzz", "--programs", "0"], "--programs"),
    (["fuzz", "--seconds", "inf"], "--seconds"), (["fuzz", "--jobs", "-1"], "--jobs"),
    (["fuzz", "--program-seconds", "nan"], "--program-seconds"),
    (["fuzz", "--program-memory-mb", "0"], "--program-memory-mb")])
def test_other_commands_check_their_numbers_too(capsys, extra, flag):
    with pytest.raises(SystemExit) as info:
        main(extra)
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"argument {flag}: expected" in err, err


@pytest.mark.parametrize("command", ["run", "explain", "export"])
@pytest.mark.parametrize("sizes,words", [
    ("M=-1,N=2,K=2", "--sizes M=-1: a size is a whole number from 0 to 2**63 - 1"),
    ("M=99999999999999999999,N=2,K=2", "a size is a whole number from 0 to 2**63 - 1"),
], ids=["negative", "past-64-bits"])
def test_negative_and_huge_sizes_are_argument_errors(source, capsys, tmp_path, command,
                                                     sizes, words):
    extra = ["-o", str(tmp_path / "out")] if command == "export" else []
    assert main([command, source, "--sizes", sizes, *extra]) == 1
    err = capsys.readouterr().err
    assert "argument error" in err and words in err and "Traceback" not in err, err


def test_inputs_larger_than_memory_are_refused_before_drawing_them(source, capsys):
    """10^14 floats each for A and B (NumPy's MemoryError was a traceback; a size that
    fits the address space but not the memory could get the process killed instead)."""
    assert main(["run", source, "--sizes", "M=10000000,N=10000000,K=10000000"]) == 1
    err = capsys.readouterr().err
    assert "random inputs 1,455 TiB, more than this machine's" in err, err


def test_tuning_calls_check_their_numbers():
    """The API behind `tclang tune` and `compare`: time_limit=nan failed every trial in
    the executor; rounds=0 timed nothing and reported a table of nans."""
    kernel = tc.define(MM).mm
    a = np.ones((2, 2), np.float32)
    for kwargs in (dict(time_limit=math.nan), dict(time_limit=0), dict(min_time=math.inf),
                   dict(jobs=0)):
        with pytest.raises(tc.TCError, match=f"{next(iter(kwargs))} must be"):
            tc.autotune(kernel, a, a, budget=1, **kwargs)
    for kwargs in (dict(rounds=0), dict(tune=-1), dict(time_limit=math.nan)):
        with pytest.raises(tc.TCError, match=f"{next(iter(kwargs))} must be"):
            tc.compare(kernel, a, a, **kwargs)

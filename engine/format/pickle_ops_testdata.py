#!/usr/bin/python3
"""Test data for engine/format/pickle_ops_test.cc: CPython's own table of pickle opcodes.

  pickle_ops_testdata.py table     one line per opcode: CODE KIND N
      CODE  the opcode byte in decimal
      KIND  none | fixed | counted | lines (the argument that follows the opcode)
      N     bytes (fixed), width of the little-endian length (counted), or lines (lines)
  pickle_ops_testdata.py samples   pickles of many objects, protocols 0 to 5, one per line as
                                   hex: every opcode walk must end exactly at the last STOP

Read from pickletools, which documents every opcode's argument.
"""
import collections
import pickletools
import pickle
import sys


def arg_of(op):
    a = op.arg
    if a is None:
        return "none", 0
    if a.name == "stringnl_noescape_pair":
        return "lines", 2
    if a.n == pickletools.UP_TO_NEWLINE:
        return "lines", 1
    counted = {
        pickletools.TAKEN_FROM_ARGUMENT1: 1,
        pickletools.TAKEN_FROM_ARGUMENT4: 4,
        pickletools.TAKEN_FROM_ARGUMENT4U: 4,
        pickletools.TAKEN_FROM_ARGUMENT8U: 8,
    }
    if a.n in counted:
        return "counted", counted[a.n]
    if a.n > 0:
        return "fixed", a.n
    raise SystemExit(f"unknown argument of {op.name}: {a.name} n={a.n}")


class Point:
    def __init__(self, x):
        self.x = x


def samples():
    objs = [
        None, True, False, 0, 1, -1, 255, 65535, 2**31 - 1, -(2**31), 2**40, -(2**70), 2**2000,
        1.5, float("inf"), "", "text", "é\u1234\U0001F600", b"", b"bytes", bytearray(b"ba"),
        (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], [1, [2, [3]]], {}, {"a": 1, 2: "b"},
        set(), {1, 2}, frozenset({3}), collections.OrderedDict(a=1), Point(3),
        {"k": ["x" * 300, b"y" * 70000]}, [[1, 2]] * 3,
    ]
    for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
        for o in objs:
            try:
                data = pickle.dumps(o, protocol=proto)
            except Exception:
                continue
            print(data.hex())


def main():
    if sys.argv[1:] == ["table"]:
        for op in pickletools.opcodes:
            kind, n = arg_of(op)
            print(ord(op.code.encode("latin-1")), kind, n)
    elif sys.argv[1:] == ["samples"]:
        samples()
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()

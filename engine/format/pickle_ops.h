// engine/format/pickle_ops.h
//
// The pickle opcodes (CPython Lib/pickle.py, protocols 0 to 5): their names, how many argument
// bytes follow each one, and the family it belongs to. The one table of opcodes in ckptfs: the
// torch pickle parser (torch_pickle.cc) dispatches on it, and the precision view's rewriter
// (engine/views/precision_view.cc) walks a pickle opcode by opcode with PickleOpLength without
// interpreting it. pickle_ops_test.cc checks the table against CPython's own (pickletools).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/util/status.h"

namespace ckptfs {

// The opcodes, by their names in pickle.py (MARK is kMark, SHORT_BINUNICODE kShortBinUnicode).
// In a namespace of their own: the names are short. `using enum pickle::Op;` in a .cc file.
namespace pickle {
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};
}  // namespace pickle

// What an opcode does, in broad strokes: the unit of dispatch for an interpreter.
enum class PickleFamily : uint8_t {
  kUnknown,    // not an opcode
  kControl,    // PROTO, FRAME, STOP, MARK, POP, POP_MARK, DUP
  kScalar,     // None, bools, ints, floats
  kText,       // str and bytes
  kContainer,  // tuples, lists, dicts, sets
  kCall,       // globals, REDUCE, BUILD, NEWOBJ, INST, OBJ, extensions, persistent ids
  kMemo,       // PUT, GET and their binary forms, MEMOIZE
};

// The argument bytes that follow an opcode.
struct PickleArg {
  enum Kind : uint8_t {
    kNone,     // none
    kFixed,    // n bytes
    kCounted,  // a little-endian length of n bytes, then that many bytes
    kLines,    // n lines, each ending in '\n'
  } kind = kNone;
  uint8_t n = 0;
};

struct PickleOpInfo {
  PickleFamily family = PickleFamily::kUnknown;
  PickleArg arg;
};

// The table entry of `op` (family kUnknown for a byte that is no opcode).
PickleOpInfo PickleOpInfoOf(uint8_t op);

// The length of the opcode that starts at pkl[at], its argument included. Corruption when `at`
// holds no opcode or the argument runs past the end of `pkl`.
Result<size_t> PickleOpLength(std::string_view pkl, size_t at);

}  // namespace ckptfs

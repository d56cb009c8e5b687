// engine/namespace/admin.h
//
// What the `ckptfs` command asks of a store beyond its files (docs/cli.md): the versions with
// what each added to the store, statistics, verify, gc, the daemon's state, and removing a
// version. Answered the same way by the mount daemon for a mounted store (the control
// socket's op "admin", control_server.h) and by the command itself for an unmounted store it
// opened, so that every command reports in one format online and offline.
//
//   nlohmann::json reply;
//   CKPTFS_ASSIGN_OR_RETURN(reply, RunAdmin(store, fs, {{"cmd", "log"}}));
//
// Requests (JSON objects; the answers' schemas are in docs/cli.md and tests/cli/schemas.json):
//   {cmd: "log", version?: NAME, files?: bool}  -> {versions: [...]} in creation order; with
//        `version` only that one; with `files` each version lists its files
//   {cmd: "files", version: NAME}               -> {files: [{path, type, size, mode, content,
//                                                   symlink}]}: every entry, dirs first
//   {cmd: "diff", v1: NAME, v2: NAME}           -> per file and per tensor (named as in the
//        per-tensor view, tensor_view.h): unchanged / changed / added / removed; a changed
//        tensor's bytes are compared a block at a time (max |a-b| for float types, the
//        fraction of elements that differ); files with the same chunks are not read
//   {cmd: "stats"}                               -> store statistics and read counters
//   {cmd: "verify"}                              -> {chunks_checked, contents_checked, problems}
//   {cmd: "gc", rewrite_below?: x}               -> gc's report (pending commits finish first)
//   {cmd: "status"}                              -> the process's settings, write queue peak, pid
//   {cmd: "forget_plan", keep_last: N, keep_every?: K}
//                                                -> {kept: [{name, seq, reason}], forgotten:
//                                                   [{name, seq}]}: the retention rules of
//                                                   `ckptfs forget` and of a mount's --keep-last
//   {cmd: "save_cost", versions?: N}            -> {versions, unmeasured, measured: [{name,
//        logical_bytes, started_unix_ns, finished_unix_ns, save_seconds, bytes_per_second}]}:
//        the newest N (default 5) versions whose times measure a save (from the version's
//        creation to its last file's commit), newest first (`ckptfs advise`; admin.cc
//        SaveCost says how)
//   {cmd: "remove_version", name: NAME}          -> {removed, parent, entry}: removes the version's
//                                                   tree (the command removes through a mount
//                                                   instead, so the kernel's caches stay right;
//                                                   the daemon's retention tells the kernel itself)
// Version metadata is read from the store without running pickle code: the tensor layout the
// writer recorded, and small JSON files (HF trainer_state.json, config.json) parsed as JSON.
// Thread-safe as Store and FileSystem are.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/namespace/filesystem.h"
#include "engine/store/store.h"
#include "engine/util/progress.h"

namespace ckptfs {

// `fs` may be null for requests that need no namespace changes (all but remove_version and gc).
// `progress`, when given, hears how far verify (record bytes checked) and gc (bytes of the
// packs it rewrites gone through) are, on the calling thread.
Result<nlohmann::json> RunAdmin(Store* store, FileSystem* fs, const nlohmann::json& request,
                                const ProgressFn& progress = {});

}  // namespace ckptfs

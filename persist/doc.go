// Package persist stores what must survive a restart of sluice: the learned
// memory-overload-protection (MOP) state of each backend and the event log.
//
// It keeps them in plain files written with write(2), never through a
// memory mapping, so that a full, read-only or vanished filesystem is an
// error the store reports and retries, not a crash; see README.md for why
// Badger (format 1) was left, and how its stores are migrated. Nothing
// here runs on a request's path: learned states are pulled and saved by a
// [Saver] on its own goroutine, and [Store.Append] only puts an event on a
// buffered channel that a writer goroutine drains.
//
// See README.md for the file layout, the format version, recovery with
// -data-reset and the crash guarantees.
package persist

// Package persist stores what must survive a restart of sluice: the learned
// memory-overload-protection (MOP) state of each backend and the event log.
//
// It is the only package that imports github.com/dgraph-io/badger/v4. Nothing
// here runs on a request's path: learned states are pulled and saved by a
// [Saver] on its own goroutine, and [Store.Append] only puts an event on a
// buffered channel that a writer goroutine drains.
//
// See README.md for the key layout, the format version, recovery with
// -data-reset and the crash guarantees.
package persist

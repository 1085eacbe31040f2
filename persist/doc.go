// Package persist stores what must survive a restart of sluice: the learned
// memory-overload-protection (MOP) state of each backend, overrides, the
// event log, and (format 3) the dashboard's history and the SIP dialogs.
//
// With Config.Child (sluice run) the store is a Badger database owned by a
// store process, a child of sluice spoken to over a socketpair (child.go,
// remote.go): Badger writes through memory mappings, and the SIGBUS a full
// filesystem raises then ends that process, which is restarted, never the
// balancer. Without it the store is format 2: plain files written with
// write(2) in this process. See README.md for both and the migrations. Nothing
// here runs on a request's path: learned states are pulled and saved by a
// [Saver] on its own goroutine, and [Store.Append] only puts an event on a
// buffered channel that a writer goroutine drains.
//
// See README.md for the file layout, the format version, recovery with
// -data-reset and the crash guarantees.
package persist

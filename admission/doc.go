// Package admission decides whether a request may enter the system.
//
// It holds the three overload guards of sluice, all pure decision logic with
// no I/O of their own:
//
//   - Memory: the node memory state of the balancer's own process (Normal,
//     Low, Lower, Critical), sampled from runtime/metrics on a ticker.
//   - Meter: an ARM rule (arrival rate meter) that admits at most Limit
//     requests per time unit, counted over six sub-intervals, with a bounded
//     delay queue and an optional qualification time.
//   - MOP: memory overload protection for one backend. It learns the highest
//     rate of new work the backend takes while its memory stays under a
//     ceiling and enforces that rate with GCRA on one atomic word.
//
// Controller ties them together behind one call, Decide, that both front ends
// use. Affinity traffic is always admitted.
//
// The package imports only the standard library. Time is passed in as
// monotonic nanoseconds (see Clock), so every rule can be tested to the tick.
// The admit paths take no mutex and allocate nothing.
package admission

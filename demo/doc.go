// Package demo provides backends for `sluice demo` that really consume
// memory per live session and report it the way a JVM application server
// does, so that sluice's memory overload protection (MOP) can be watched
// learning the rate of new work each backend can take.
//
// A Ledger holds one real, resident allocation per live session and reports
// used memory against a configured maximum. MetricsHandler exposes a Ledger
// as Prometheus text with the JVM Micrometer heap gauges that MOP's memory
// probe reads by default, or as the JSON report; HealthHandler answers 429
// above HealthThreshold of the maximum, as Oracle Health Insurance's memory
// states do. HTTPBackend is a small web application whose sessions (a
// DEMOSESSION cookie) each hold memory for a lifetime. The SIP counterpart,
// which holds memory per dialog, is sip/sipdemo.
//
// This package imports the standard library only.
package demo

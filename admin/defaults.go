package admin

// DefaultListen is the admin listener's default address (flag
// -admin-listen), and where `sluice ctl` and `sluice events` look for it.
const DefaultListen = "127.0.0.1:9090"

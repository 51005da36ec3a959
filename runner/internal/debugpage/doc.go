// Package debugpage serves a runner's debug page: an HTML page, and the
// same data as a JSON document (State), showing the runner and the cluster
// as the runner sees it — registered runners, the shard map by owner,
// moves and handoffs in flight, entities and message rates per kind, and
// the latest events. Package runner exposes it as (*Runner).DebugHandler;
// its public types are aliases of this package's.
//
// The page reads a runner only through a Source, whose Snapshot is plain
// data copied by the runner; this package does not import package runner.
//
// # Guarantees
//
//   - Read-only: a request changes nothing in the runner or the store. It
//     takes one Snapshot and reads nothing else of the runner (making the
//     handler takes one more); the handler answers GET and HEAD only (405
//     otherwise).
//   - Cost: a request costs O(shards) + O(entities) on the serving runner
//     (the Snapshot's copy of the lock view and its count of resident
//     entities), plus building the page, O(shards) bytes before gzip.
//   - Self-contained: the page's template, style sheet and script are
//     embedded; the page loads no external asset and needs no build step.
//   - Peers: each listed runner's own state is fetched concurrently from
//     the debug URL Config.PeerURL returns for it or, without PeerURL, the
//     one its record publishes, each fetch bounded by Config.PeerTimeout
//     and by 4 MiB of answer; a peer that does not
//     answer in time — its process is gone — is shown as unreachable on
//     that very request, it never holds the request longer. ?peers=0 skips
//     the fetches (peers ask each other with it, so a request never fans
//     out further than one hop), and peers ask each other for ?part=self
//     only: a page of 100 runners of 65 536 shards fetches 100 small
//     documents, not 100 shard maps of ~200 KB each.
//   - Credentials go where the operator sends them: Config.HTTPClient
//     fetches only the URLs Config.PeerURL returns (PeerURL alone decides
//     when set: "" means no URL); the URLs runners publish, which whoever
//     may write the namespace chooses, are fetched by a client without
//     credentials, and one carrying credentials (user:password@) is
//     neither fetched nor shown. No fetch follows a redirect to another
//     scheme or host, or to a URL with credentials.
//   - Size: the shard map has one cell per shard, ~20 bytes of HTML each
//     before gzip (~1.3 MB for 65 536 shards of 100 runners, ~110 KB
//     compressed); the page's script spaces its refreshes out when one
//     takes more than a quarter of the refresh interval.
//   - Rates: message rates are counter deltas between samples at least a
//     second apart, the first taken when the handler is made, so a first
//     request a second or more later shows them.
//   - Versioned: the JSON document names its schema (Schema); fields are
//     only ever added under one schema name, never renamed or dropped.
//
// # Concurrency
//
// A handler is safe for concurrent use: concurrent requests each take
// their own Snapshot (Source.Snapshot must allow that) and share only the
// rate sampler, under its mutex. Every goroutine a request starts (one per
// peer fetch) ends before the request returns.
package debugpage

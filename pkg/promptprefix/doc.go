// Package promptprefix turns a request's prompt into prefix blocks and
// remembers where they were served: Blocks hashes the prompt of an OpenAI
// completions or chat completions body into chained block hashes (each
// standing for the whole prefix up to its block), and Index is the bounded,
// approximate index of which clusters or servers most recently served each
// block, asked per request how long a prefix each candidate likely holds.
//
// mci-sidecar's cluster scoring (pkg/clusterscore) and mci-epp's prefix
// filter (pkg/epp) both use it, so that neither links the other's policy.
// The decisions behind it (bytes for tokens, the set-associative table) are
// in docs/design/cluster-scoring.md.
//
// Concurrency: Blocks is a pure function; an Index is safe for concurrent
// use.
package promptprefix

// Package virtual keeps the objects of one computed, read-only resource
// (InferencePoolImports or InferencePoolExports) up to date as the
// ClusterSet cache changes, and serves them to GET, LIST and WATCH with a
// change history so that watches can resume. Nothing is persisted: the
// objects are recomputed from the member caches, and a restarted server
// computes the same objects again.
package virtual

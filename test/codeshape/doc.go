// Package codeshape holds tests of the shape of mci's own code that the
// compiler and go vet do not check: the routing packages keep their
// functions short enough to read at once.
package codeshape

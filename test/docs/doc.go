// Package docs checks the documentation as a newcomer reads it: every
// relative link of README.md and docs/ leads to a file and heading that
// exist, and the generated references of docs/reference (every flag of
// every binary, the served API's types) match the code. Run
// hack/update-docs.sh when a reference is stale.
package docs

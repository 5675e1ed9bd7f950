package conformance

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

var metav1GetOptions = metav1.GetOptions{}

// AllTests are the suite's tests, in the order they run.
func AllTests() []Test {
	var all []Test
	all = append(all, lifecycleTests()...)
	all = append(all, membershipTests()...)
	all = append(all, apiTests()...)
	all = append(all, discoveryTests()...)
	all = append(all, statusTests()...)
	all = append(all, optionalTests()...)
	all = append(all, scopeTests()...)
	all = append(all, moreTests()...)
	all = append(all, expiredTests()...)
	all = append(all, dataPathTests()...)
	return all
}

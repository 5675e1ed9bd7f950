package imports

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
)

// endpointCounts is what a Service's EndpointSlices say about it.
type endpointCounts struct {
	slices, endpoints, ready int
}

// add counts one slice. An endpoint is ready when conditions.ready is true
// or unset: the EndpointSlice API says nil means ready.
func (c *endpointCounts) add(s *discoveryv1.EndpointSlice) {
	c.slices++
	for i := range s.Endpoints {
		c.endpoints++
		if r := s.Endpoints[i].Conditions.Ready; r == nil || *r {
			c.ready++
		}
	}
}

// endpointCounter answers endpointCounts for a Service of one member.
type endpointCounter interface {
	count(namespace, service string) endpointCounts
}

// sliceLister queries the lister for each Service: right for a single
// import, where one Service per exporter is looked at.
type sliceLister struct {
	lister discoverylisters.EndpointSliceLister
}

func (l sliceLister) count(namespace, service string) endpointCounts {
	var c endpointCounts
	if l.lister == nil {
		return c
	}
	slices, err := l.lister.EndpointSlices(namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service}))
	if err != nil {
		return c
	}
	for _, s := range slices {
		if s != nil {
			c.add(s)
		}
	}
	return c
}

// sliceIndex holds the counts of the wanted Services of one member, from a
// single pass over its slices: right for a list of imports, where a lister
// query per Service would scan a namespace's slices once per pool. A Service
// that was not wanted is looked up through the lister.
type sliceIndex struct {
	counts   map[poolKey]*endpointCounts
	fallback sliceLister
}

// newSliceIndex lists the member's slices in namespace ("" = all) once and
// counts those of the wanted Services.
func newSliceIndex(lister discoverylisters.EndpointSliceLister, namespace string, wanted map[poolKey]struct{}) sliceIndex {
	idx := sliceIndex{counts: make(map[poolKey]*endpointCounts, len(wanted)), fallback: sliceLister{lister: lister}}
	for k := range wanted {
		idx.counts[k] = &endpointCounts{}
	}
	if lister == nil || len(wanted) == 0 {
		return idx
	}
	var (
		all []*discoveryv1.EndpointSlice
		err error
	)
	if namespace == "" {
		all, err = lister.List(labels.Everything())
	} else {
		all, err = lister.EndpointSlices(namespace).List(labels.Everything())
	}
	if err != nil {
		return idx
	}
	for _, s := range all {
		if s == nil {
			continue
		}
		svc, ok := s.Labels[discoveryv1.LabelServiceName]
		if !ok {
			continue
		}
		if c, ok := idx.counts[poolKey{namespace: s.Namespace, name: svc}]; ok {
			c.add(s)
		}
	}
	return idx
}

func (idx sliceIndex) count(namespace, service string) endpointCounts {
	if c, ok := idx.counts[poolKey{namespace: namespace, name: service}]; ok {
		return *c
	}
	return idx.fallback.count(namespace, service)
}

package clusterset

import (
	"sync"

	"k8s.io/client-go/tools/cache"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/imports"
)

// heldClusterSummary is what a member's view reads of the
// InferenceClusterSummaries it published: how many this server holds (a
// member's mci-apiserver publishes one, named after the member), the name
// of the one, and its namespaces.
type heldClusterSummary struct {
	count      int
	name       string
	namespaces imports.SummaryNamespaces
}

// clusterSummaryIndexer is the informer's cache of a member's cluster
// summaries. It works out what the member's view reads of them on each
// write, under a lock that the write holds too: a view is taken of every
// member at every recomputation, and listing the cache there cost more
// than the rest of the view at a thousand members. Reading under that
// lock, a view never lags the cache: a summary that names another
// cluster is refused from the moment it is stored, before its handler
// freezes the member.
type clusterSummaryIndexer struct {
	cache.Indexer
	mu   sync.RWMutex
	held heldClusterSummary
}

func newClusterSummaryIndexer() *clusterSummaryIndexer {
	return &clusterSummaryIndexer{Indexer: cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})}
}

// summary is what the cache holds now.
func (c *clusterSummaryIndexer) summary() heldClusterSummary {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.held
}

func (c *clusterSummaryIndexer) Add(obj interface{}) error {
	return c.write(func() error { return c.Indexer.Add(obj) })
}

func (c *clusterSummaryIndexer) Update(obj interface{}) error {
	return c.write(func() error { return c.Indexer.Update(obj) })
}

func (c *clusterSummaryIndexer) Delete(obj interface{}) error {
	return c.write(func() error { return c.Indexer.Delete(obj) })
}

func (c *clusterSummaryIndexer) Replace(list []interface{}, rv string) error {
	return c.write(func() error { return c.Indexer.Replace(list, rv) })
}

// write applies a change to the cache and works out what it holds, as
// one step for the view.
func (c *clusterSummaryIndexer) write(change func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := change()
	all := c.Indexer.List()
	c.held = heldClusterSummary{count: len(all)}
	if len(all) == 1 {
		if s, ok := all[0].(*v1alpha1.InferenceClusterSummary); ok {
			// The informer sorted and compacted them (trimSummary).
			c.held.name, c.held.namespaces = s.Name, imports.SummaryNamespaces(s.Status.Namespaces)
		}
	}
	return err
}

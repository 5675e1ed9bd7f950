package clusterset

import (
	"encoding/json"
	"fmt"
	"unique"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/compact"
	inferencelisters "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha1"
)

// The summaries of other members are most of what a server of a large
// ClusterSet holds in summary mode: one per pool of every other member.
// The informer keeps each one encoded (package compact), with what its
// indexes and events need in the clear, and summaryLister decodes a fresh
// copy on each read: about 350 bytes a summary where the decoded object
// took 1.4 KiB (BenchmarkSummaryCacheBytesPerPool).

// summaryCodec encodes every member's summaries: its dictionary, the first
// summary received, serves them all.
var summaryCodec = compact.New()

// compactSummary is an InferencePoolExportSummary as the informer keeps it.
// It is never changed once made.
type compactSummary struct {
	namespace, name string
	// resourceVersion is the summary's, down to its member component
	// (trimSummary).
	resourceVersion string
	data            string
	// size is the summary's size as JSON once trimmed, before compression:
	// what the member's limits count (quota.go), since a summary that
	// compresses well (a megabyte of one letter) still costs its full
	// size on each read and in every import computed from it.
	size int
}

var (
	_ runtime.Object            = &compactSummary{}
	_ metav1.ObjectMetaAccessor = &compactSummary{}
)

func (c *compactSummary) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject returns c: it is never changed.
func (c *compactSummary) DeepCopyObject() runtime.Object { return c }

// GetObjectMeta gives the indexer (keys, the namespace index) and the
// event handlers what they read.
func (c *compactSummary) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion}
}

// compactOf encodes a trimmed summary.
func compactOf(s *v1alpha1.InferencePoolExportSummary) (*compactSummary, error) {
	// The resourceVersion is kept in the clear only: the events read it,
	// and it compresses worst of all.
	rv := s.ResourceVersion
	s.ResourceVersion = ""
	data, err := summaryCodec.Encode(s)
	if err != nil {
		return nil, fmt.Errorf("keeping summary %s/%s: %w", s.Namespace, s.Name, err)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("keeping summary %s/%s: %w", s.Namespace, s.Name, err)
	}
	return &compactSummary{namespace: unique.Make(s.Namespace).Value(), name: s.Name, resourceVersion: rv, data: data, size: len(raw)}, nil
}

// summaryLister is the lister of a member's summaries over the informer's
// indexer of compact ones.
type summaryLister struct {
	indexer cache.Indexer
	logger  klog.Logger
}

var _ inferencelisters.InferencePoolExportSummaryLister = summaryLister{}

func (l summaryLister) List(selector labels.Selector) ([]*v1alpha1.InferencePoolExportSummary, error) {
	return l.decodeMatching(l.indexer.List(), selector), nil
}

func (l summaryLister) InferencePoolExportSummaries(namespace string) inferencelisters.InferencePoolExportSummaryNamespaceLister {
	return summaryNamespaceLister{summaryLister: l, namespace: namespace}
}

type summaryNamespaceLister struct {
	summaryLister
	namespace string
}

func (l summaryNamespaceLister) List(selector labels.Selector) ([]*v1alpha1.InferencePoolExportSummary, error) {
	items, err := l.indexer.ByIndex(cache.NamespaceIndex, l.namespace)
	if err != nil {
		return nil, err
	}
	return l.decodeMatching(items, selector), nil
}

func (l summaryNamespaceLister) Get(name string) (*v1alpha1.InferencePoolExportSummary, error) {
	obj, exists, err := l.indexer.GetByKey(l.namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !exists {
		return nil, apierrors.NewNotFound(v1alpha1.Resource("inferencepoolexportsummary"), name)
	}
	s, err := decodeSummary(obj)
	if err != nil {
		l.logger.Error(err, "Cannot read a summary this server keeps")
		return nil, err
	}
	return s, nil
}

// decodeMatching decodes the summaries among items that selector selects.
// One that does not decode (a bug: the informer encoded it) is logged and
// left out.
func (l summaryLister) decodeMatching(items []interface{}, selector labels.Selector) []*v1alpha1.InferencePoolExportSummary {
	out := make([]*v1alpha1.InferencePoolExportSummary, 0, len(items))
	for _, obj := range items {
		s, err := decodeSummary(obj)
		if err != nil {
			l.logger.Error(err, "Cannot read a summary this server keeps")
			continue
		}
		if selector.Matches(labels.Set(s.Labels)) {
			out = append(out, s)
		}
	}
	return out
}

func decodeSummary(obj interface{}) (*v1alpha1.InferencePoolExportSummary, error) {
	c, ok := obj.(*compactSummary)
	if !ok {
		return nil, fmt.Errorf("summary cache holds a %T", obj)
	}
	s := &v1alpha1.InferencePoolExportSummary{}
	if err := summaryCodec.Decode(c.data, s); err != nil {
		return nil, fmt.Errorf("summary %s/%s: %w", c.namespace, c.name, err)
	}
	s.ResourceVersion = c.resourceVersion
	return s, nil
}

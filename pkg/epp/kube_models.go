package epp

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	inferencepoolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	v1alpha2listers "github.com/mci-dev/mci/pkg/generated/listers/inference/v1alpha2"
	llmdlisters "github.com/mci-dev/mci/pkg/generated/listers/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/servedapis"
)

// The model configuration resources KubeSource reads, as API discovery
// names them ("<group>/<version>/<resource>").
var (
	apiInferenceModels = v1alpha2.SchemeGroupVersion.WithResource("inferencemodels")
	apiObjectives      = v1alpha2.SchemeGroupVersion.WithResource("inferenceobjectives")
	apiRewrites        = v1alpha2.SchemeGroupVersion.WithResource("inferencemodelrewrites")
	apiLLMDObjectives  = llmdv1alpha2.SchemeGroupVersion.WithResource("inferenceobjectives")
	apiLLMDRewrites    = llmdv1alpha2.SchemeGroupVersion.WithResource("inferencemodelrewrites")
	modelConfigAPIs    = []schema.GroupVersionResource{apiInferenceModels, apiObjectives, apiRewrites, apiLLMDObjectives, apiLLMDRewrites}
)

// servedConfigAPIs asks the cluster which model configuration resources it
// serves (pkg/servedapis, as mci-apiserver and mci-sidecar ask).
func (s *KubeSource) servedConfigAPIs(ctx context.Context) map[schema.GroupVersionResource]bool {
	return servedapis.Discover(ctx, s.Client.Discovery(), 0, modelConfigAPIs...).Map()
}

// configListers are the listers of the served model configuration
// resources (nil for the others) and their informers.
type configListers struct {
	models         func(labels.Selector) ([]*v1alpha2.InferenceModel, error)
	objectives     func(labels.Selector) ([]*v1alpha2.InferenceObjective, error)
	rewrites       func(labels.Selector) ([]*v1alpha2.InferenceModelRewrite, error)
	llmdObjectives func(labels.Selector) ([]*llmdv1alpha2.InferenceObjective, error)
	llmdRewrites   func(labels.Selector) ([]*llmdv1alpha2.InferenceModelRewrite, error)
	informers      []cache.SharedIndexInformer
}

func (s *KubeSource) configListers(served map[schema.GroupVersionResource]bool) configListers {
	var cl configListers
	c, ns := s.Client, s.Namespace
	// watched builds the informer of a served resource, which s.watches
	// follows, and returns its cache.
	watched := func(r schema.GroupVersionResource, lw cache.ListerWatcher, example runtime.Object) cache.Indexer {
		inf := s.watches().NewInformer(r.GroupResource().String(), lw, example)
		cl.informers = append(cl.informers, inf)
		return inf.GetIndexer()
	}
	if served[apiInferenceModels] {
		x := c.InferenceV1alpha2().InferenceModels(ns)
		cl.models = v1alpha2listers.NewInferenceModelLister(watched(apiInferenceModels, informerhealth.ListWatch(c, x.List, x.Watch), &v1alpha2.InferenceModel{})).InferenceModels(ns).List
	}
	if served[apiObjectives] {
		x := c.InferenceV1alpha2().InferenceObjectives(ns)
		cl.objectives = v1alpha2listers.NewInferenceObjectiveLister(watched(apiObjectives, informerhealth.ListWatch(c, x.List, x.Watch), &v1alpha2.InferenceObjective{})).InferenceObjectives(ns).List
	}
	if served[apiRewrites] {
		x := c.InferenceV1alpha2().InferenceModelRewrites(ns)
		cl.rewrites = v1alpha2listers.NewInferenceModelRewriteLister(watched(apiRewrites, informerhealth.ListWatch(c, x.List, x.Watch), &v1alpha2.InferenceModelRewrite{})).InferenceModelRewrites(ns).List
	}
	if served[apiLLMDObjectives] {
		x := c.LLMDV1alpha2().InferenceObjectives(ns)
		cl.llmdObjectives = llmdlisters.NewInferenceObjectiveLister(watched(apiLLMDObjectives, informerhealth.ListWatch(c, x.List, x.Watch), &llmdv1alpha2.InferenceObjective{})).InferenceObjectives(ns).List
	}
	if served[apiLLMDRewrites] {
		x := c.LLMDV1alpha2().InferenceModelRewrites(ns)
		cl.llmdRewrites = llmdlisters.NewInferenceModelRewriteLister(watched(apiLLMDRewrites, informerhealth.ListWatch(c, x.List, x.Watch), &llmdv1alpha2.InferenceModelRewrite{})).InferenceModelRewrites(ns).List
	}
	return cl
}

// syncModels sets the model configuration objects that name the pool.
func (s *KubeSource) syncModels(logger klog.Logger, c configListers, models *requestmodel.Models) {
	cfg, err := s.modelConfig(c)
	if err != nil {
		logger.Error(err, "Listing the pool's model configuration")
		return
	}
	for _, ignored := range models.Set(cfg) {
		logger.V(2).Info("Ignoring or repairing part of the model configuration", "note", ignored)
	}
}

func (s *KubeSource) modelConfig(c configListers) (requestmodel.ModelConfig, error) {
	var cfg requestmodel.ModelConfig
	if c.models != nil {
		all, err := c.models(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceModels: %w", err)
		}
		for _, im := range all {
			if ref := im.Spec.PoolRef; ref.Name == s.PoolName && (ref.Kind == "" || ref.Kind == "InferencePool") {
				cfg.Models = append(cfg.Models, im)
			}
		}
	}
	if c.objectives != nil {
		all, err := c.objectives(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceObjectives: %w", err)
		}
		for _, o := range all {
			if s.namesPool(&o.Spec.PoolRef) {
				cfg.Objectives = append(cfg.Objectives, o)
			}
		}
	}
	if c.llmdObjectives != nil {
		all, err := c.llmdObjectives(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceObjectives (llm-d.ai): %w", err)
		}
		for _, o := range all {
			if s.namesPool(&o.Spec.PoolRef) {
				cfg.Objectives = append(cfg.Objectives, requestmodel.ObjectiveFromLLMD(o))
			}
		}
	}
	if c.rewrites != nil {
		all, err := c.rewrites(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceModelRewrites: %w", err)
		}
		for _, rw := range all {
			if s.namesPool(rw.Spec.PoolRef) {
				cfg.Rewrites = append(cfg.Rewrites, rw)
			}
		}
	}
	if c.llmdRewrites != nil {
		all, err := c.llmdRewrites(labels.Everything())
		if err != nil {
			return cfg, fmt.Errorf("InferenceModelRewrites (llm-d.ai): %w", err)
		}
		for _, rw := range all {
			if s.namesPool(rw.Spec.PoolRef) {
				cfg.Rewrites = append(cfg.Rewrites, requestmodel.RewriteFromLLMD(rw))
			}
		}
	}
	return cfg, nil
}

// namesPool reports whether a poolRef names the pool: its name, and the
// InferencePool kind and group, or none (the CRDs' defaults), as upstream
// EPPs compare them.
func (s *KubeSource) namesPool(ref *v1alpha2.PoolObjectReference) bool {
	return ref != nil && ref.Name == s.PoolName &&
		(ref.Kind == "" || ref.Kind == "InferencePool") &&
		(ref.Group == "" || ref.Group == inferencepoolv1.SchemeGroupVersion.Group)
}

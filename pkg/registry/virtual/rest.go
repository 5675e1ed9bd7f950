package virtual

import (
	"context"
	"fmt"
	"k8s.io/apimachinery/pkg/api/meta"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
)

// Describe names a computed resource for the API machinery.
type Describe struct {
	Resource     schema.GroupResource
	Kind         string
	SingularName string
	ShortNames   []string
	// ReadOnlyReason ends the message of every refused write.
	ReadOnlyReason string
	New            func() Object
	NewList        func() runtime.Object
	// SetItems puts objects into a list made by NewList.
	SetItems func(list runtime.Object, items []Object)
	Table    rest.TableConvertor
	// ClusterScoped serves the resource without namespaces; its Store's
	// objects all have the namespace "".
	ClusterScoped bool
}

// REST serves a Store as a read-only Kubernetes resource.
// Writes are refused with 405 MethodNotAllowed and a message that says
// where the objects come from.
type REST struct {
	rest.TableConvertor
	store *Store
	desc  Describe
	ready func() error
	// visible, when set, says which objects the requester of ctx may be
	// sent at all: GET answers 404 for the others, and LIST and WATCH
	// leave them out as a selector would (an object that becomes visible
	// or invisible is ADDED or DELETED in a watch).
	visible func(ctx context.Context) func(Object) bool
}

// WithVisibility makes the resource serve each requester only the objects
// visible(ctx) accepts (see REST.visible).
func (r *REST) WithVisibility(visible func(ctx context.Context) func(Object) bool) *REST {
	r.visible = visible
	return r
}

// match is the selectors of options and the requester's visibility, as
// one predicate; nil when every object matches.
func (r *REST) match(ctx context.Context, options *metainternalversion.ListOptions) func(Object) bool {
	selected := matcher(options)
	if r.visible == nil {
		return selected
	}
	v := r.visible(ctx)
	// A watch hands over its live objects wrapped to be encoded once: the
	// resource's rule reads the object it computed.
	visible := func(o Object) bool {
		if e, ok := o.(*encodedOnce); ok {
			o = e.Object
		}
		return v(o)
	}
	if selected == nil {
		return visible
	}
	return func(o Object) bool { return visible(o) && selected(o) }
}

// NewREST returns the storage of a computed resource. ready reports
// whether the data the store is computed from is complete.
func NewREST(store *Store, desc Describe, ready func() error) *REST {
	return &REST{TableConvertor: desc.Table, store: store, desc: desc, ready: ready}
}

var (
	_ rest.Getter               = &REST{}
	_ rest.Lister               = &REST{}
	_ rest.Watcher              = &REST{}
	_ rest.Scoper               = &REST{}
	_ rest.KindProvider         = &REST{}
	_ rest.ShortNamesProvider   = &REST{}
	_ rest.SingularNameProvider = &REST{}
	_ rest.StorageWithReadiness = &REST{}
	_ rest.Creater              = &REST{}
	_ rest.Updater              = &REST{}
	_ rest.GracefulDeleter      = &REST{}
	_ rest.CollectionDeleter    = &REST{}
	_ rest.StandardStorage      = &REST{}
	_ rest.TableConvertor       = &REST{}
	_ rest.CategoriesProvider   = &REST{}
)

// New implements rest.Storage.
func (r *REST) New() runtime.Object { return r.desc.New() }

// NewList implements rest.Lister.
func (r *REST) NewList() runtime.Object { return r.desc.NewList() }

// Destroy implements rest.Storage; the store is stopped with the server.
func (r *REST) Destroy() {}

// NamespaceScoped implements rest.Scoper.
func (r *REST) NamespaceScoped() bool { return !r.desc.ClusterScoped }

// Kind implements rest.KindProvider.
func (r *REST) Kind() string { return r.desc.Kind }

// GetSingularName implements rest.SingularNameProvider.
func (r *REST) GetSingularName() string { return r.desc.SingularName }

// ShortNames implements rest.ShortNamesProvider.
func (r *REST) ShortNames() []string { return r.desc.ShortNames }

// Categories implements rest.CategoriesProvider: `kubectl get mci`
// shows every mci resource.
func (r *REST) Categories() []string { return []string{"mci"} }

// ReadinessCheck implements rest.StorageWithReadiness.
func (r *REST) ReadinessCheck() error {
	if err := r.ready(); err != nil {
		return err
	}
	if !r.store.Ready() {
		return fmt.Errorf("%s are not computed yet", r.desc.Resource.String())
	}
	return nil
}

// Get implements rest.Getter.
func (r *REST) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns := genericapirequest.NamespaceValue(ctx)
	o, ok, err := r.store.Get(ns, name)
	if err != nil {
		return nil, err
	}
	if !ok || (r.visible != nil && !r.visible(ctx)(o)) {
		return nil, apierrors.NewNotFound(r.desc.Resource, name)
	}
	return o, nil
}

// List implements rest.Lister, with resourceVersion,
// resourceVersionMatch, limit and continue as Store.ListWithOptions serves
// them.
func (r *REST) List(ctx context.Context, options *metainternalversion.ListOptions) (runtime.Object, error) {
	opts := ListOptions{Namespace: genericapirequest.NamespaceValue(ctx), Match: r.match(ctx, options)}
	if options != nil {
		opts.ResourceVersion = options.ResourceVersion
		opts.ResourceVersionMatch = options.ResourceVersionMatch
		opts.Limit = options.Limit
		opts.Continue = options.Continue
	}
	pg, rv, err := r.store.ListWithOptions(ctx, opts)
	if err != nil {
		return nil, err
	}
	list := r.desc.NewList()
	r.desc.SetItems(list, pg.items)
	if err := setListResourceVersion(list, rv); err != nil {
		return nil, err
	}
	if pg.next != "" {
		accessor, err := meta.ListAccessor(list)
		if err != nil {
			return nil, err
		}
		accessor.SetContinue(pg.next)
		accessor.SetRemainingItemCount(&pg.remaining)
	}
	return list, nil
}

// Watch implements rest.Watcher.
func (r *REST) Watch(ctx context.Context, options *metainternalversion.ListOptions) (watch.Interface, error) {
	opts := WatchOptions{Namespace: genericapirequest.NamespaceValue(ctx), Match: r.match(ctx, options)}
	if options != nil {
		opts.ResourceVersion = options.ResourceVersion
		opts.SendInitialEvents = options.SendInitialEvents != nil && *options.SendInitialEvents
		opts.AllowBookmarks = options.AllowWatchBookmarks
	}
	return r.store.Watch(ctx, opts)
}

func matcher(options *metainternalversion.ListOptions) func(Object) bool {
	label, field := labels.Everything(), fields.Everything()
	if options != nil {
		if options.LabelSelector != nil {
			label = options.LabelSelector
		}
		if options.FieldSelector != nil {
			field = options.FieldSelector
		}
	}
	// The API machinery has already refused field selectors other than
	// metadata.name and metadata.namespace, the only fields these objects
	// are selectable by.
	if label.Empty() && field.Empty() {
		// Every object: the Store decodes only what it returns.
		return nil
	}
	return func(o Object) bool {
		if !label.Matches(labels.Set(o.GetLabels())) {
			return false
		}
		return field.Matches(fields.Set{"metadata.name": o.GetName(), "metadata.namespace": o.GetNamespace()})
	}
}

func setListResourceVersion(list runtime.Object, rv string) error {
	l, ok := list.(metav1.ListInterface)
	if !ok {
		return fmt.Errorf("%T is not a list", list)
	}
	l.SetResourceVersion(rv)
	return nil
}

func (r *REST) readOnly(verb string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure,
		Code:   405,
		Reason: metav1.StatusReasonMethodNotAllowed,
		Details: &metav1.StatusDetails{
			Group: r.desc.Resource.Group,
			Kind:  r.desc.Resource.Resource,
		},
		Message: fmt.Sprintf("%s is not allowed on %s: they are read-only, %s", verb, r.desc.Resource.String(), r.desc.ReadOnlyReason),
	}}
}

// Create implements rest.Creater by refusing.
func (r *REST) Create(context.Context, runtime.Object, rest.ValidateObjectFunc, *metav1.CreateOptions) (runtime.Object, error) {
	return nil, r.readOnly("create")
}

// Update implements rest.Updater (and so patch) by refusing.
func (r *REST) Update(context.Context, string, rest.UpdatedObjectInfo, rest.ValidateObjectFunc, rest.ValidateObjectUpdateFunc, bool, *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return nil, false, r.readOnly("update")
}

// Delete implements rest.GracefulDeleter by refusing.
func (r *REST) Delete(context.Context, string, rest.ValidateObjectFunc, *metav1.DeleteOptions) (runtime.Object, bool, error) {
	return nil, false, r.readOnly("delete")
}

// DeleteCollection implements rest.CollectionDeleter by refusing.
func (r *REST) DeleteCollection(context.Context, rest.ValidateObjectFunc, *metav1.DeleteOptions, *metainternalversion.ListOptions) (runtime.Object, error) {
	return nil, r.readOnly("deletecollection")
}

// StatusREST serves the status subresource, read-only like its parent.
type StatusREST struct {
	parent *REST
}

// NewStatusREST returns the status subresource storage of parent.
func NewStatusREST(parent *REST) *StatusREST { return &StatusREST{parent: parent} }

var (
	_ rest.Getter  = &StatusREST{}
	_ rest.Updater = &StatusREST{}
)

// New implements rest.Storage.
func (r *StatusREST) New() runtime.Object { return r.parent.New() }

// Destroy implements rest.Storage.
func (r *StatusREST) Destroy() {}

// Get implements rest.Getter.
func (r *StatusREST) Get(ctx context.Context, name string, opts *metav1.GetOptions) (runtime.Object, error) {
	return r.parent.Get(ctx, name, opts)
}

// Update implements rest.Updater by refusing: status is computed too.
func (r *StatusREST) Update(context.Context, string, rest.UpdatedObjectInfo, rest.ValidateObjectFunc, rest.ValidateObjectUpdateFunc, bool, *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return nil, false, r.parent.readOnly("update of status")
}

// ConvertToTable implements rest.TableConvertor.
func (r *StatusREST) ConvertToTable(ctx context.Context, obj runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.parent.ConvertToTable(ctx, obj, tableOptions)
}

// ConditionStatus returns the status of the condition of type t, or
// "Unknown" when there is none: the value of a table's condition column.
func ConditionStatus(conditions []metav1.Condition, t string) string {
	for _, c := range conditions {
		if c.Type == t {
			return string(c.Status)
		}
	}
	return string(metav1.ConditionUnknown)
}

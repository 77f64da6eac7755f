// Package removal tells an agent that is asked to stop (SIGTERM) whether the
// product is being removed from its node, or only this pod replaced.
//
// The agent keeps its datapath pinned when it stops, on purpose: an upgrade,
// a restart, a drain or a deleted pod must not disturb live connections.
// Removal is the one case where it must take everything away, and it looks
// no different from inside the pod: the kubelet sends SIGTERM either way. The
// difference is the DaemonSet the agent runs under: `helm uninstall` (or
// `kubectl delete daemonset`) deletes it, and its pods are terminated
// because of that, whereas an upgrade keeps it. So the agent watches that one
// DaemonSet from its start (get, list and watch on it alone: a Role with its
// resourceNames) and, at SIGTERM, asks whether the DaemonSet it saw is
// gone, being deleted, or replaced by another of the same name.
//
// The watch matters because `helm uninstall` deletes the agent's
// ServiceAccount and RBAC in the same breath as its DaemonSet: by the time the
// kubelet sends SIGTERM, a new request may be refused, while a watch opened
// earlier has already delivered the deletion.
package removal

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Watch follows one DaemonSet.
type Watch struct {
	client    kubernetes.Interface
	namespace string
	name      string
	stop      context.CancelFunc
	done      chan struct{}

	mu sync.Mutex
	// uid is the DaemonSet first seen: the one the agent runs under.
	uid types.UID
	// deleted: the watch saw that DaemonSet deleted, or replaced by
	// another of the same name. deleting: it has a deletion timestamp
	// (foreground deletion waits for its pods first).
	deleted, deleting bool
}

// Start watches DaemonSet namespace/name until Stop.
func Start(client kubernetes.Interface, namespace, name string) *Watch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watch{client: client, namespace: namespace, name: name, stop: cancel, done: make(chan struct{})}
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return client.AppsV1().DaemonSets(namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return client.AppsV1().DaemonSets(namespace).Watch(ctx, o)
		},
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &appsv1.DaemonSet{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.seen(obj) },
			UpdateFunc: func(_, obj any) { w.seen(obj) },
			DeleteFunc: w.gone,
		},
	})
	go func() {
		defer close(w.done)
		informer.RunWithContext(ctx)
	}()
	return w
}

// Stop ends the watch.
func (w *Watch) Stop() {
	w.stop()
	<-w.done
}

func (w *Watch) seen(obj any) {
	ds, ok := obj.(*appsv1.DaemonSet)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.uid == "":
		w.uid = ds.UID
	case ds.UID != w.uid:
		w.deleted = true // deleted and created again under the same name
		return
	}
	w.deleting = ds.DeletionTimestamp != nil
}

func (w *Watch) gone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ds, ok := obj.(*appsv1.DaemonSet)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.uid != "" && ds.UID == w.uid {
		w.deleted = true
	}
}

// verdict is what the watch knows: removed, or not yet known to be.
func (w *Watch) verdict() (removed bool, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.deleted:
		return true, fmt.Sprintf("DaemonSet %s/%s was deleted", w.namespace, w.name)
	case w.deleting:
		return true, fmt.Sprintf("DaemonSet %s/%s is being deleted", w.namespace, w.name)
	}
	return false, ""
}

// Removed says whether the DaemonSet the agent runs under is gone or going,
// with the reason either way. It asks the API server once more if the watch
// has not seen it deleted, and waits for an answer (the watch's or the
// server's) until ctx ends. When nothing tells, the answer is no: keeping
// the datapath is the safe side (it keeps steering; `agent -uninstall`
// removes it by hand).
func (w *Watch) Removed(ctx context.Context) (bool, string) {
	var last error
	for {
		if removed, why := w.verdict(); removed {
			return true, why
		}
		ds, err := w.client.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
		w.mu.Lock()
		uid := w.uid
		w.mu.Unlock()
		switch {
		case err == nil && uid == "":
			return false, fmt.Sprintf("DaemonSet %s/%s exists, but this agent never saw it before: keeping the datapath", w.namespace, w.name)
		case err == nil && ds.UID != uid:
			return true, fmt.Sprintf("DaemonSet %s/%s was deleted (another of the same name exists)", w.namespace, w.name)
		case err == nil && ds.DeletionTimestamp != nil:
			return true, fmt.Sprintf("DaemonSet %s/%s is being deleted", w.namespace, w.name)
		case err == nil:
			return false, fmt.Sprintf("DaemonSet %s/%s remains: this pod is being replaced", w.namespace, w.name)
		case apierrors.IsNotFound(err) && uid != "":
			return true, fmt.Sprintf("DaemonSet %s/%s was deleted", w.namespace, w.name)
		case apierrors.IsNotFound(err):
			return false, fmt.Sprintf("DaemonSet %s/%s does not exist and this agent never saw it: keeping the datapath", w.namespace, w.name)
		}
		last = err
		select {
		case <-ctx.Done():
			return false, fmt.Sprintf("cannot tell whether DaemonSet %s/%s is being removed (%v): keeping the datapath", w.namespace, w.name, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Package transparent changes a pod at its creation so that programs which
// do not open MPTCP sockets themselves get them: Go programs through
// GODEBUG multipathtcp, programs that open sockets through libc through the
// preload library (preload/), delivered by an init container into a volume
// every container mounts. It is the mutating webhook's logic, kept apart
// from admission so that it can be read and tested as a function of a pod.
package transparent

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	jsonpatch "gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/preload"
)

const (
	// AnnotationMode records on a pod what the webhook did to it (the
	// mode applied); set by a tenant to OptOut, it keeps the pod as it
	// is.
	AnnotationMode = "mptcp.io/transparent"
	// AnnotationPolicy names, on a changed pod, the policy whose
	// podMPTCP.transparent it got.
	AnnotationPolicy = "mptcp.io/transparent-policy"
	// AnnotationNotCovered lists, on a changed pod, the containers the
	// webhook left as they were, with the reason.
	AnnotationNotCovered = "mptcp.io/transparent-not-covered"

	// InitContainerName is the init container that copies the preload
	// library into the pod's volume.
	InitContainerName = "mptcp-preload"
	// VolumeName is the volume the library is copied into.
	VolumeName = "mptcp-preload"
	// MountPath is where every container sees the library's directory.
	MountPath = "/var/run/mptcp-preload"

	// GODEBUGKey is Go's setting for MPTCP: 0 off, 1 listeners and
	// dialers, 2 listeners only (the default since Go 1.24), 3 dialers
	// only.
	GODEBUGKey = "multipathtcp"
)

// LibraryPath is the preload library's path inside every container.
var LibraryPath = MountPath + "/" + preload.Library

// Injector changes pods.
type Injector struct {
	// Image holds the preload library and a program that copies it:
	// the agent's image (already on every node).
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// Command copies the library into its one argument, a directory.
	Command []string
}

// MaxContainers is the most containers (init containers included) of a pod
// the webhook changes; a larger pod is left as it is. Real pods have a
// handful; the bound keeps one pod's review cheap.
const MaxContainers = 64

// OptOut, as the value of AnnotationMode on a pod being created, keeps the
// pod as it is whatever its policy says.
const OptOut = "skip"

// Change is what Plan decided for a pod.
type Change struct {
	// Patch is a JSON patch (RFC 6902) against the pod as it was
	// admitted; empty when the pod is left as it is. It touches only
	// what it changes (the changed containers' env and volumeMounts, the
	// volume, the init container, the annotations), so fields of the pod
	// this code does not know survive.
	Patch []jsonpatch.JsonPatchOperation
	// Skipped says why the whole pod is left as it is, or "".
	Skipped string
	// NotCovered maps a container left as it was to the reason.
	NotCovered map[string]string
}

// Plan decides how pod changes for mode, the podMPTCP.transparent of
// policy, without changing it. For inject,
// each container (init containers included) gets GODEBUG multipathtcp=1
// merged into its own GODEBUG, and the library first in its LD_PRELOAD,
// except where that would override what the container sets itself
// (below); for off, multipathtcp=0, which turns Go's MPTCP listeners (the
// default since Go 1.24) back into TCP ones.
//
// A container keeps its own choice: a multipathtcp already in its GODEBUG
// stays. A container whose GODEBUG or LD_PRELOAD comes from a reference
// (valueFrom), or that takes variables from envFrom (which a variable set
// here would override, unseen), is left as it was and listed in
// NotCovered. A pod that opts out (AnnotationMode: skip), that already
// uses the library's volume, mount path or init container name (it could
// otherwise reach the volume, writable), or that has more than
// MaxContainers containers is left as it is.
func (inj Injector) Plan(pod *corev1.Pod, mode mptcpv1alpha1.TransparentMPTCP, policy string) Change {
	ch := Change{NotCovered: map[string]string{}}
	godebug := map[mptcpv1alpha1.TransparentMPTCP]string{mptcpv1alpha1.TransparentInject: "1", mptcpv1alpha1.TransparentOff: "0"}[mode]
	if godebug == "" {
		ch.Skipped = fmt.Sprintf("no transparent mode %q", mode)
		return ch
	}
	preloading := mode == mptcpv1alpha1.TransparentInject
	if ch.Skipped = skipReason(pod, preloading); ch.Skipped != "" {
		return ch
	}
	var ops []jsonpatch.JsonPatchOperation
	covered := 0
	change := func(list string, i int, orig *corev1.Container) {
		if reason := uncovered(orig, preloading); reason != "" {
			ch.NotCovered[orig.Name] = reason
			return
		}
		covered++
		c := orig.DeepCopy()
		setGODEBUG(c, godebug)
		if preloading {
			prependPreload(c)
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeName, MountPath: MountPath, ReadOnly: true})
		}
		at := fmt.Sprintf("/spec/%s/%d/", list, i)
		ops = append(ops, setField(at+"env", orig.Env != nil, c.Env))
		if preloading {
			ops = append(ops, setField(at+"volumeMounts", orig.VolumeMounts != nil, c.VolumeMounts))
		}
	}
	// Containers first: the init container below goes in front of the
	// others, and these operations use their indices as admitted.
	for i := range pod.Spec.InitContainers {
		change("initContainers", i, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		change("containers", i, &pod.Spec.Containers[i])
	}
	if covered > 0 && preloading {
		vol := corev1.Volume{Name: VolumeName, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("4Mi"))}}}
		ops = append(ops, appendTo("/spec/volumes", pod.Spec.Volumes != nil, vol))
		// First, so that the library is in place for every other init
		// container too.
		if pod.Spec.InitContainers == nil {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/initContainers", []corev1.Container{inj.initContainer()}))
		} else {
			ops = append(ops, jsonpatch.NewOperation("add", "/spec/initContainers/0", inj.initContainer()))
		}
	}
	annotations := map[string]string{AnnotationMode: string(mode), AnnotationPolicy: policy}
	if len(ch.NotCovered) > 0 {
		var notes []string
		for _, name := range slices.Sorted(maps.Keys(ch.NotCovered)) {
			notes = append(notes, name+": "+ch.NotCovered[name])
		}
		annotations[AnnotationNotCovered] = strings.Join(notes, "; ")
	}
	ops = append(ops, annotate(pod, annotations)...)
	ch.Patch = ops
	return ch
}

// annotate returns the operations that set annotations on pod.
func annotate(pod *corev1.Pod, annotations map[string]string) []jsonpatch.JsonPatchOperation {
	if pod.Annotations == nil {
		return []jsonpatch.JsonPatchOperation{jsonpatch.NewOperation("add", "/metadata/annotations", annotations)}
	}
	var ops []jsonpatch.JsonPatchOperation
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		// "add" on an object member replaces it (RFC 6902 4.1).
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+escapePointer(k), annotations[k]))
	}
	return ops
}

// setField replaces the field at path, or adds it where the pod had none.
func setField(path string, present bool, value any) jsonpatch.JsonPatchOperation {
	if present {
		return jsonpatch.NewOperation("replace", path, value)
	}
	return jsonpatch.NewOperation("add", path, value)
}

// appendTo appends value to the list at path, or makes the list.
func appendTo(path string, present bool, value any) jsonpatch.JsonPatchOperation {
	if present {
		return jsonpatch.NewOperation("add", path+"/-", value)
	}
	return jsonpatch.NewOperation("add", path, []any{value})
}

// escapePointer escapes a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// skipReason says why pod must be left as it is, or "".
func skipReason(pod *corev1.Pod, preloading bool) string {
	if pod.Annotations[AnnotationMode] == OptOut {
		return fmt.Sprintf("the pod opts out (%s: %s)", AnnotationMode, OptOut)
	}
	if n := len(pod.Spec.InitContainers) + len(pod.Spec.Containers); n > MaxContainers {
		return fmt.Sprintf("the pod has %d containers, more than the %d the webhook changes", n, MaxContainers)
	}
	if !preloading {
		return ""
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeName {
			return fmt.Sprintf("the pod already has a volume named %s", VolumeName)
		}
	}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if c.Name == InitContainerName {
			return fmt.Sprintf("the pod already has a container named %s", InitContainerName)
		}
		for _, m := range c.VolumeMounts {
			if m.Name == VolumeName || path.Clean(m.MountPath) == MountPath {
				return fmt.Sprintf("container %s already mounts %s or %s", c.Name, VolumeName, MountPath)
			}
		}
	}
	return ""
}

// uncovered says why c must be left as it is, or "".
func uncovered(c *corev1.Container, preloading bool) string {
	if len(c.EnvFrom) > 0 {
		return "it takes variables from envFrom, where a GODEBUG or LD_PRELOAD set here would override one of its own unseen"
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && (e.Name == "GODEBUG" || (preloading && e.Name == "LD_PRELOAD")) {
			return fmt.Sprintf("its %s comes from a reference (valueFrom), which cannot be merged with", e.Name)
		}
	}
	return ""
}

// setGODEBUG adds multipathtcp=value to c's GODEBUG unless it names
// multipathtcp itself. Where a variable is given twice the kubelet passes
// the last, and Go reads GODEBUG's keys as written (no spaces trimmed):
// so does this.
func setGODEBUG(c *corev1.Container, value string) {
	setting := GODEBUGKey + "=" + value
	if i := lastEnv(c, "GODEBUG"); i >= 0 {
		for _, kv := range strings.Split(c.Env[i].Value, ",") {
			if k, _, _ := strings.Cut(kv, "="); k == GODEBUGKey {
				return
			}
		}
		if c.Env[i].Value == "" {
			c.Env[i].Value = setting
		} else {
			c.Env[i].Value += "," + setting
		}
		return
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "GODEBUG", Value: setting})
}

// lastEnv is the index of the last variable name of c, or -1.
func lastEnv(c *corev1.Container, name string) int {
	for i := len(c.Env) - 1; i >= 0; i-- {
		if c.Env[i].Name == name {
			return i
		}
	}
	return -1
}

// prependPreload puts the library first in c's LD_PRELOAD (the dynamic
// loader takes a list separated by spaces or colons); a library already
// there keeps working: each passes socket() on to the next.
func prependPreload(c *corev1.Container) {
	if i := lastEnv(c, "LD_PRELOAD"); i >= 0 {
		if v := strings.TrimSpace(c.Env[i].Value); v != "" {
			c.Env[i].Value = LibraryPath + ":" + v
		} else {
			c.Env[i].Value = LibraryPath
		}
		return
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "LD_PRELOAD", Value: LibraryPath})
}

// initContainer copies the library. It meets the restricted Pod Security
// Standard, so that it is admitted wherever the pod's own containers are.
func (inj Injector) initContainer() corev1.Container {
	return corev1.Container{
		Name:            InitContainerName,
		Image:           inj.Image,
		ImagePullPolicy: inj.ImagePullPolicy,
		Command:         append(slices.Clone(inj.Command), MountPath),
		VolumeMounts:    []corev1.VolumeMount{{Name: VolumeName, MountPath: MountPath}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](65532),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

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
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/preload"
)

const (
	// AnnotationMode records on a pod what the webhook did to it (the
	// mode applied); a pod without it was not changed. It also makes a
	// second admission of the same pod (webhook reinvocation) change
	// nothing more.
	AnnotationMode = "mptcp.io/transparent"
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

// Result says what Apply did.
type Result struct {
	// Changed is false when the pod was left as it was.
	Changed bool
	// NotCovered maps a container left as it was to the reason.
	NotCovered map[string]string
}

// Apply changes pod for mode. A pod the webhook already changed is left
// alone. For inject, each container (init containers included) gets
// GODEBUG multipathtcp=1 merged into its own GODEBUG, and the library
// first in its LD_PRELOAD, except where that would override what the
// container sets itself (below); for off, multipathtcp=0, which turns Go's
// MPTCP listeners (the default since Go 1.24) back into TCP ones.
//
// A container keeps its own choice: a multipathtcp already in its GODEBUG
// stays. A container whose GODEBUG or LD_PRELOAD comes from a reference
// (valueFrom), or that takes variables from envFrom (which a variable set
// here would override, unseen), is left as it was and listed in
// NotCovered.
func (inj Injector) Apply(pod *corev1.Pod, mode mptcpv1alpha1.TransparentMPTCP) Result {
	res := Result{NotCovered: map[string]string{}}
	if _, done := pod.Annotations[AnnotationMode]; done {
		return res
	}
	godebug := map[mptcpv1alpha1.TransparentMPTCP]string{mptcpv1alpha1.TransparentInject: "1", mptcpv1alpha1.TransparentOff: "0"}[mode]
	if godebug == "" {
		return res
	}
	preloading := mode == mptcpv1alpha1.TransparentInject
	covered := 0
	change := func(c *corev1.Container) {
		if reason := uncovered(c, preloading); reason != "" {
			res.NotCovered[c.Name] = reason
			return
		}
		covered++
		setGODEBUG(c, godebug)
		if preloading {
			prependPreload(c)
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeName, MountPath: MountPath, ReadOnly: true})
		}
	}
	for i := range pod.Spec.InitContainers {
		change(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		change(&pod.Spec.Containers[i])
	}
	if covered == 0 {
		// Nothing to deliver the library to: no volume, no init
		// container; the annotations still say why.
		preloading = false
	}
	if preloading {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: VolumeName, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("4Mi"))}}})
		// First, so that the library is in place for every other init
		// container too.
		pod.Spec.InitContainers = append([]corev1.Container{inj.initContainer()}, pod.Spec.InitContainers...)
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationMode] = string(mode)
	if len(res.NotCovered) > 0 {
		var notes []string
		for _, name := range slices.Sorted(maps.Keys(res.NotCovered)) {
			notes = append(notes, name+": "+res.NotCovered[name])
		}
		pod.Annotations[AnnotationNotCovered] = strings.Join(notes, "; ")
	}
	res.Changed = true
	return res
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
// multipathtcp itself.
func setGODEBUG(c *corev1.Container, value string) {
	setting := GODEBUGKey + "=" + value
	for i := range c.Env {
		if c.Env[i].Name != "GODEBUG" {
			continue
		}
		for _, kv := range strings.Split(c.Env[i].Value, ",") {
			if k, _, _ := strings.Cut(strings.TrimSpace(kv), "="); k == GODEBUGKey {
				return
			}
		}
		if strings.TrimSpace(c.Env[i].Value) == "" {
			c.Env[i].Value = setting
		} else {
			c.Env[i].Value += "," + setting
		}
		return
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "GODEBUG", Value: setting})
}

// prependPreload puts the library first in c's LD_PRELOAD (the dynamic
// loader takes a list separated by spaces or colons); a library already
// there keeps working: each passes socket() on to the next.
func prependPreload(c *corev1.Container) {
	for i := range c.Env {
		if c.Env[i].Name == "LD_PRELOAD" {
			if v := strings.TrimSpace(c.Env[i].Value); v != "" {
				c.Env[i].Value = LibraryPath + ":" + v
			} else {
				c.Env[i].Value = LibraryPath
			}
			return
		}
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

package transparent

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

var injector = Injector{Image: "agent:1", ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"/agent", "-install-preload"}}

func env(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func mounted(c corev1.Container) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == VolumeName && m.MountPath == MountPath && m.ReadOnly {
			return true
		}
	}
	return false
}

func testPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "setup"}},
		Containers: []corev1.Container{
			{Name: "plain"},
			{Name: "godebug", Env: []corev1.EnvVar{{Name: "GODEBUG", Value: "http2client=0"}}},
			{Name: "own-choice", Env: []corev1.EnvVar{{Name: "GODEBUG", Value: "x=1, multipathtcp=2"}}},
			{Name: "preloads", Env: []corev1.EnvVar{{Name: "LD_PRELOAD", Value: "/usr/lib/libtrace.so"}}},
			{Name: "env-from", EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}},
			{Name: "referenced", Env: []corev1.EnvVar{{Name: "LD_PRELOAD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}},
		},
	}}
}

// inject: every container the webhook can change gets multipathtcp=1 merged
// into its GODEBUG and the library first in its LD_PRELOAD, with the
// volume mounted read-only; the init container that fills the volume comes
// first; a container's own multipathtcp stays; containers whose variables
// cannot be merged are left alone and named.
func TestInjectChangesEveryContainerItCanAndNamesTheOthers(t *testing.T) {
	pod := testPod()
	res := injector.Apply(pod, mptcpv1alpha1.TransparentInject)
	if !res.Changed {
		t.Fatal("the pod was not changed")
	}
	byName := map[string]corev1.Container{}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		byName[c.Name] = c
	}
	for name, want := range map[string]string{
		"setup": "multipathtcp=1", "plain": "multipathtcp=1", "godebug": "http2client=0,multipathtcp=1",
		"own-choice": "x=1, multipathtcp=2", "preloads": "multipathtcp=1",
	} {
		if got, _ := env(byName[name], "GODEBUG"); got != want {
			t.Errorf("%s: GODEBUG %q, want %q", name, got, want)
		}
		wantPreload := LibraryPath
		if name == "preloads" {
			wantPreload = LibraryPath + ":/usr/lib/libtrace.so"
		}
		if got, _ := env(byName[name], "LD_PRELOAD"); got != wantPreload {
			t.Errorf("%s: LD_PRELOAD %q, want %q", name, got, wantPreload)
		}
		if !mounted(byName[name]) {
			t.Errorf("%s: the library's volume is not mounted read-only at %s", name, MountPath)
		}
	}
	for _, name := range []string{"env-from", "referenced"} {
		c := byName[name]
		if _, ok := env(c, "GODEBUG"); ok || mounted(c) {
			t.Errorf("%s was changed: %+v", name, c)
		}
		if res.NotCovered[name] == "" || !strings.Contains(pod.Annotations[AnnotationNotCovered], name+": ") {
			t.Errorf("%s is not named as left alone: %v, annotation %q", name, res.NotCovered, pod.Annotations[AnnotationNotCovered])
		}
	}
	first := pod.Spec.InitContainers[0]
	if first.Name != InitContainerName || first.Image != "agent:1" || strings.Join(first.Command, " ") != "/agent -install-preload "+MountPath {
		t.Errorf("first init container %s %s %v, want the copier of the library", first.Name, first.Image, first.Command)
	}
	if sc := first.SecurityContext; sc == nil || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("the init container's security context %+v does not meet the restricted standard", sc)
	}
	volumes := 0
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeName && v.EmptyDir != nil {
			volumes++
		}
	}
	if volumes != 1 || pod.Annotations[AnnotationMode] != "inject" {
		t.Errorf("volumes %d, annotation %q; want one emptyDir and inject", volumes, pod.Annotations[AnnotationMode])
	}

	// A second admission of the same pod (reinvocation) changes nothing.
	before := pod.DeepCopy()
	if res := injector.Apply(pod, mptcpv1alpha1.TransparentInject); res.Changed || len(pod.Spec.InitContainers) != len(before.Spec.InitContainers) {
		t.Errorf("a pod changed already was changed again")
	}
}

// off: multipathtcp=0 where a container does not choose itself; no library,
// no volume, no init container.
func TestOffTurnsGoMPTCPOffAndAddsNothingElse(t *testing.T) {
	pod := testPod()
	injector.Apply(pod, mptcpv1alpha1.TransparentOff)
	if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Volumes) != 0 {
		t.Errorf("off added init containers %v or volumes %v", pod.Spec.InitContainers, pod.Spec.Volumes)
	}
	for _, c := range pod.Spec.Containers {
		got, _ := env(c, "GODEBUG")
		switch c.Name {
		case "plain", "preloads":
			if got != "multipathtcp=0" {
				t.Errorf("%s: GODEBUG %q, want multipathtcp=0", c.Name, got)
			}
		case "own-choice":
			if got != "x=1, multipathtcp=2" {
				t.Errorf("%s: its own multipathtcp changed: %q", c.Name, got)
			}
		}
		if p, _ := env(c, "LD_PRELOAD"); strings.Contains(p, LibraryPath) {
			t.Errorf("%s: off preloads the library", c.Name)
		}
	}
	if pod.Annotations[AnnotationMode] != "off" {
		t.Errorf("annotation %q, want off", pod.Annotations[AnnotationMode])
	}
}

// A pod none of whose containers can be changed gets no volume and no init
// container, only the annotations that say why.
func TestAPodWithNothingToChangeGetsOnlyTheReason(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{}}}}}}}
	injector.Apply(pod, mptcpv1alpha1.TransparentInject)
	if len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Volumes) != 0 || pod.Annotations[AnnotationNotCovered] == "" {
		t.Errorf("init containers %v, volumes %v, annotations %v", pod.Spec.InitContainers, pod.Spec.Volumes, pod.Annotations)
	}
}

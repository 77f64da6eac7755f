package transparent

import (
	"encoding/json"
	"strings"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
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

// apply plans pod's change for mode and applies the patch as the API
// server would, to the pod as JSON.
func apply(t *testing.T, pod *corev1.Pod, mode mptcpv1alpha1.TransparentMPTCP) Change {
	t.Helper()
	ch := injector.Plan(pod, mode, "p1")
	if len(ch.Patch) == 0 {
		return ch
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := json.Marshal(ch.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatchapply.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("the patch does not apply: %v\n%s", err, ops)
	}
	*pod = corev1.Pod{}
	if err := json.Unmarshal(out, pod); err != nil {
		t.Fatal(err)
	}
	return ch
}

func testPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "setup"}},
		Containers: []corev1.Container{
			{Name: "plain"},
			{Name: "godebug", Env: []corev1.EnvVar{{Name: "GODEBUG", Value: "http2client=0"}}},
			{Name: "own-choice", Env: []corev1.EnvVar{{Name: "GODEBUG", Value: "x=1,multipathtcp=2"}}},
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
	res := apply(t, pod, mptcpv1alpha1.TransparentInject)
	if res.Skipped != "" || len(res.Patch) == 0 {
		t.Fatalf("the pod was not changed: %s", res.Skipped)
	}
	byName := map[string]corev1.Container{}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		byName[c.Name] = c
	}
	for name, want := range map[string]string{
		"setup": "multipathtcp=1", "plain": "multipathtcp=1", "godebug": "http2client=0,multipathtcp=1",
		"own-choice": "x=1,multipathtcp=2", "preloads": "multipathtcp=1",
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
	if volumes != 1 || pod.Annotations[AnnotationMode] != "inject" || pod.Annotations[AnnotationPolicy] != "p1" {
		t.Errorf("volumes %d, annotations %v; want one emptyDir, inject from p1", volumes, pod.Annotations)
	}
	if pod.Spec.InitContainers[1].Name != "setup" {
		t.Errorf("the pod's own init container moved: %v", pod.Spec.InitContainers)
	}

	// The same pod again (kubectl get -o yaml | kubectl create) uses the
	// library's names already: left as it is.
	if again := injector.Plan(pod, mptcpv1alpha1.TransparentInject, "p1"); again.Skipped == "" || len(again.Patch) != 0 {
		t.Errorf("a pod that holds the library's names was changed again: %+v", again)
	}
}

// A pod that could reach the library's volume with a mount of its own (the
// name, or the path), or that names a container as the init container,
// opts out, or is too large, is left as it is, with the reason.
func TestPodsThatClashOrOptOutAreLeftAsTheyAre(t *testing.T) {
	for name, edit := range map[string]func(*corev1.Pod){
		"a mount named as the volume": func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: VolumeName, MountPath: "/x"}}
		},
		"a mount at the path": func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "own", MountPath: MountPath + "/"}}
		},
		"a volume of the name":    func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{{Name: VolumeName}} },
		"the init container name": func(p *corev1.Pod) { p.Spec.InitContainers[0].Name = InitContainerName },
		"opted out":               func(p *corev1.Pod) { p.Annotations = map[string]string{AnnotationMode: OptOut} },
		"too many containers": func(p *corev1.Pod) {
			for len(p.Spec.Containers) <= MaxContainers {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c"})
			}
		},
	} {
		pod := testPod()
		edit(pod)
		if ch := injector.Plan(pod, mptcpv1alpha1.TransparentInject, "p1"); ch.Skipped == "" || len(ch.Patch) != 0 {
			t.Errorf("%s: the pod is changed (%d operations)", name, len(ch.Patch))
		}
	}
}

// Where a variable is given twice the kubelet passes the last: that is the
// one merged with. GODEBUG keys count as Go reads them, spaces and all.
func TestTheLastOfATwiceGivenVariableIsTheOneMerged(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Env: []corev1.EnvVar{
		{Name: "GODEBUG", Value: "multipathtcp=0"}, {Name: "GODEBUG", Value: " multipathtcp=0"}, {Name: "LD_PRELOAD", Value: "a.so"}, {Name: "LD_PRELOAD", Value: "b.so"}}}}}}
	apply(t, pod, mptcpv1alpha1.TransparentInject)
	env := pod.Spec.Containers[0].Env
	if env[0].Value != "multipathtcp=0" || env[1].Value != " multipathtcp=0,multipathtcp=1" {
		t.Errorf("GODEBUG %q, %q; want the first untouched and the last merged (its key has a space: not Go's multipathtcp)", env[0].Value, env[1].Value)
	}
	if env[2].Value != "a.so" || env[3].Value != LibraryPath+":b.so" {
		t.Errorf("LD_PRELOAD %q, %q; want the last one with the library first", env[2].Value, env[3].Value)
	}
}

// Fields of the pod this code does not know (a newer API's) survive: the
// patch touches only what it changes.
func TestFieldsThisCodeDoesNotKnowSurvive(t *testing.T) {
	raw := []byte(`{"metadata":{"name":"p"},"spec":{"futureField":{"x":1},"containers":[{"name":"app","image":"a","futureContainerField":true,"securityContext":{"futureRestriction":"strict"}}]}}`)
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	ch := injector.Plan(&pod, mptcpv1alpha1.TransparentInject, "p1")
	ops, _ := json.Marshal(ch.Patch)
	patch, err := jsonpatchapply.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"futureField":{"x":1}`, `"futureContainerField":true`, `"futureRestriction":"strict"`, LibraryPath} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the patched pod lacks %s:\n%s", want, out)
		}
	}
}

// off: multipathtcp=0 where a container does not choose itself; no library,
// no volume, no init container.
func TestOffTurnsGoMPTCPOffAndAddsNothingElse(t *testing.T) {
	pod := testPod()
	apply(t, pod, mptcpv1alpha1.TransparentOff)
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
			if got != "x=1,multipathtcp=2" {
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
	apply(t, pod, mptcpv1alpha1.TransparentInject)
	if len(pod.Spec.InitContainers) != 0 || len(pod.Spec.Volumes) != 0 || pod.Annotations[AnnotationNotCovered] == "" {
		t.Errorf("init containers %v, volumes %v, annotations %v", pod.Spec.InitContainers, pod.Spec.Volumes, pod.Annotations)
	}
}

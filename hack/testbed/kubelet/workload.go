package kubelet

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// defaultPath stands in for the PATH an image would set: the workload runs
// with only its Pod spec's environment (env -i), as in a container.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// command is the argv that runs container c of pod in its bed slot: env -i
// gives the process exactly the spec's environment (plus PATH and HOSTNAME, as
// a runtime does), so an admission mutation of env is what the workload sees.
func command(ctx context.Context, c client.Reader, pod *corev1.Pod, ctr *corev1.Container) ([]string, error) {
	if len(ctr.Command) == 0 {
		return nil, fmt.Errorf("container %s has no command: the stand-in runs no images, so the spec must name the program", ctr.Name)
	}
	env, err := resolveEnv(ctx, c, pod, ctr)
	if err != nil {
		return nil, err
	}
	argv := []string{"env", "-i"}
	if ctr.WorkingDir != "" {
		argv = append(argv, "-C", ctr.WorkingDir)
	}
	vars := map[string]string{}
	hasPath := false
	for _, kv := range env {
		if kv[0] == "PATH" {
			hasPath = true
		}
		vars[kv[0]] = kv[1]
	}
	if !hasPath {
		argv = append(argv, "PATH="+defaultPath)
	}
	argv = append(argv, "HOSTNAME="+pod.Name)
	for _, kv := range env {
		argv = append(argv, kv[0]+"="+kv[1])
	}
	for _, a := range ctr.Command {
		argv = append(argv, expand(a, vars))
	}
	for _, a := range ctr.Args {
		argv = append(argv, expand(a, vars))
	}
	return argv, nil
}

var envName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// resolveEnv returns the container's environment in order, each value with
// $(VAR) references to earlier variables expanded, as the kubelet does.
func resolveEnv(ctx context.Context, c client.Reader, pod *corev1.Pod, ctr *corev1.Container) ([][2]string, error) {
	if len(ctr.EnvFrom) > 0 {
		return nil, fmt.Errorf("container %s: envFrom is not supported by the stand-in", ctr.Name)
	}
	var out [][2]string
	seen := map[string]string{}
	for _, e := range ctr.Env {
		if !envName.MatchString(e.Name) {
			return nil, fmt.Errorf("container %s: bad environment variable name %q", ctr.Name, e.Name)
		}
		v := expand(e.Value, seen)
		if e.ValueFrom != nil {
			var err error
			if v, err = valueFrom(ctx, c, pod, e.ValueFrom); err != nil {
				return nil, fmt.Errorf("container %s, env %s: %w", ctr.Name, e.Name, err)
			}
		}
		seen[e.Name] = v
		out = append(out, [2]string{e.Name, v})
	}
	return out, nil
}

var varRef = regexp.MustCompile(`\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)`)

// expand replaces $(NAME) by the variable's value when it is defined and $$
// by $, leaving unknown references as written (the kubelet's rules).
func expand(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := vars[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

func valueFrom(ctx context.Context, c client.Reader, pod *corev1.Pod, src *corev1.EnvVarSource) (string, error) {
	switch {
	case src.FieldRef != nil:
		return fieldValue(pod, src.FieldRef.FieldPath)
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: ref.Name}, cm); err != nil {
			return optional(ref.Optional, fmt.Errorf("configmap %s: %w", ref.Name, err))
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, nil
		}
		return optional(ref.Optional, fmt.Errorf("configmap %s has no key %s", ref.Name, ref.Key))
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: ref.Name}, s); err != nil {
			return optional(ref.Optional, fmt.Errorf("secret %s: %w", ref.Name, err))
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), nil
		}
		return optional(ref.Optional, fmt.Errorf("secret %s has no key %s", ref.Name, ref.Key))
	}
	return "", fmt.Errorf("unsupported valueFrom (fieldRef, configMapKeyRef and secretKeyRef are)")
}

func optional(opt *bool, err error) (string, error) {
	if opt != nil && *opt {
		return "", nil
	}
	return "", err
}

// fieldValue resolves the downward API's field paths.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if rest, ok := strings.CutPrefix(path, prefix+"['"); ok && strings.HasSuffix(rest, "']") {
			return m[strings.TrimSuffix(rest, "']")], nil
		}
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

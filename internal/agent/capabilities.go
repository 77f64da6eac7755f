package agent

// Capabilities returns the Linux capabilities the agent needs, and the only
// ones it should hold (docs/agent.md#capabilities): BPF objects (bpf), TC
// links, rules and routes (net_admin), entering pod network namespaces
// (sys_admin), and the verifier's pointer arithmetic (perfmon). Names are as
// in capabilities(7), lower case, without "CAP_". The e2e tests run the agent
// with exactly these, and the Helm chart's DaemonSet adds exactly these: both
// read them from here, so the declaration cannot drift from either.
func Capabilities() []string {
	return []string{"bpf", "net_admin", "sys_admin", "perfmon"}
}

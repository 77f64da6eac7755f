package controlplane

import (
	"fmt"
	"net/url"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// RelayInto makes the API server reachable at its own address from inside
// network namespace ns (a name under /var/run/netns); Stop closes the relay.
// A namespace gets one relay however often it is asked for (a node's kubelet
// and its agent share it).
func (cp *ControlPlane) RelayInto(ns string) (*testbed.Relay, error) {
	if r := cp.apiRelays[ns]; r != nil {
		return r, nil
	}
	u, err := url.Parse(cp.Env.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address: %w", err)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("API server address %q has no host", cp.Env.Config.Host)
	}
	r, err := testbed.StartRelay(ns, u.Host)
	if err != nil {
		return nil, err
	}
	if cp.apiRelays == nil {
		cp.apiRelays = map[string]*testbed.Relay{}
	}
	cp.apiRelays[ns] = r
	cp.relays = append(cp.relays, r)
	return r, nil
}

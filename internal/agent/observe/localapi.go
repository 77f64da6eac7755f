package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agentapi"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// The local API serves per-connection detail (the subflows, their paths
// and roles) on a unix socket under the state directory. Authentication is
// twofold (docs/agent.md, "Local API"): the socket is mode 0600 in a 0700
// directory, both root's, so only root can connect; and every connection's
// peer credentials (SO_PEERCRED, set by the kernel at connect) must say uid
// 0, so a socket made reachable by mistake (a bind mount, a chmod) still
// answers nobody else. It only reads the datapath's maps; MPTCP keys are
// never stored there, so they cannot leak through it.

// LocalAPISocket is the socket's name under the state directory.
const LocalAPISocket = agentapi.Socket

type peerKey struct{}

// localAPIHandler serves /v1/subflows, /v1/connections and
// /v1/pods/NAMESPACE/NAME.
func localAPIHandler(src Source, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/subflows", func(w http.ResponseWriter, r *http.Request) {
		out, err := subflowInfos(src)
		reply(w, out, err)
	})
	mux.HandleFunc("GET /v1/connections", func(w http.ResponseWriter, r *http.Request) {
		out, err := connectionInfos(src)
		reply(w, out, err)
	})
	// One pod report at a time: each reads the node's tables whole.
	reports := make(chan struct{}, 1)
	mux.HandleFunc("GET /v1/pods/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		select {
		case reports <- struct{}{}:
			defer func() { <-reports }()
		case <-r.Context().Done():
			return
		}
		out, err := podReport(src, r.PathValue("namespace"), r.PathValue("name"))
		reply(w, out, err)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, _ := r.Context().Value(peerKey{}).(*unix.Ucred)
		if cred == nil || cred.Uid != 0 {
			uid := "unknown"
			if cred != nil {
				uid = fmt.Sprint(cred.Uid)
			}
			log.Warn("local API: refused a client that is not root", "uid", uid)
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "only root (uid 0) may use the agent's local API"})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func subflowInfos(src Source) ([]agentapi.SubflowInfo, error) {
	sfs, err := src.Datapath().Subflows()
	if err != nil {
		return nil, err
	}
	paths, rules := src.PathNames(), src.RuleNames()
	out := make([]agentapi.SubflowInfo, 0, len(sfs))
	for _, s := range sfs {
		info := agentapi.SubflowInfo{
			Local: s.Local.String(), Remote: s.Remote.String(),
			Path: paths[s.Path], PathIndex: s.Path, Role: roleName(s.Role),
			RuleIndex: s.Rule, Created: datapath.KtimeToTime(s.CreatedNs),
			TxBytes: s.Counters.TxBytes, RxBytes: s.Counters.RxBytes,
		}
		if s.Detour != 0 {
			info.Detour = paths[s.Detour]
		}
		if s.Token != 0 {
			info.Token = fmt.Sprintf("%08x", s.Token)
		}
		if s.Conn != 0 {
			info.Connection = fmt.Sprintf("%08x", s.Conn)
		}
		info.Rule = rules[s.Rule]
		out = append(out, info)
	}
	slices.SortFunc(out, func(x, y agentapi.SubflowInfo) int {
		return strings.Compare(x.Local+x.Remote, y.Local+y.Remote)
	})
	return out, nil
}

func connectionInfos(src Source) ([]agentapi.ConnectionInfo, error) {
	conns, err := src.Datapath().Connections()
	if err != nil {
		return nil, err
	}
	traffic, err := src.Datapath().ConnectionStats()
	if err != nil {
		return nil, err
	}
	paths := src.PathNames()
	out := make([]agentapi.ConnectionInfo, 0, len(conns))
	for _, c := range conns {
		info := agentapi.ConnectionInfo{Local: c.Local.String(), Token: fmt.Sprintf("%08x", c.Token), Joins: c.Joins, Paths: []string{}}
		t := traffic[datapath.ConnKey{Local: c.Local, Token: c.Token}]
		info.TxBytes, info.RxBytes = t.TxBytes, t.RxBytes
		for p := uint32(1); datapath.ValidPath(p); p++ {
			if c.UsedPaths&(1<<p) != 0 {
				name := paths[p]
				if name == "" {
					name = fmt.Sprintf("index-%d", p)
				}
				info.Paths = append(info.Paths, name)
			}
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(x, y agentapi.ConnectionInfo) int { return strings.Compare(x.Local+x.Token, y.Local+y.Token) })
	return out, nil
}

func podReport(src Source, namespace, name string) (agentapi.PodReport, error) {
	out := agentapi.PodReport{Namespace: namespace, Name: name, Connections: []agentapi.PodConnection{}}
	agentName := namespace + "." + name
	pods := src.Pods() // once: a reconcile may replace the list meanwhile
	i := slices.IndexFunc(pods, func(p podnet.Pod) bool { return p.Name == agentName })
	if i < 0 {
		return out, nil
	}
	pod := pods[i]
	out.Configured = true
	mine := func(addr string) bool {
		a, err := netip.ParseAddr(addr)
		return err == nil && slices.Contains(pod.IPs, a.Unmap())
	}
	conns, err := connectionInfos(src)
	if err != nil {
		return out, err
	}
	sfs, err := subflowInfos(src)
	if err != nil {
		return out, err
	}
	// The pod's subflows by connection, grouped once: a pod with many
	// connections costs the tables' sizes, not their product.
	type connKey struct{ local, token string }
	byConn := map[connKey][]agentapi.SubflowInfo{}
	for _, s := range sfs {
		local, err := netip.ParseAddrPort(s.Local)
		if err != nil || s.Connection == "" || !slices.Contains(pod.IPs, local.Addr().Unmap()) {
			continue
		}
		k := connKey{local.Addr().Unmap().String(), s.Connection}
		byConn[k] = append(byConn[k], s)
	}
	for _, c := range conns {
		if !mine(c.Local) {
			continue
		}
		subflows := byConn[connKey{c.Local, c.Token}]
		if subflows == nil {
			subflows = []agentapi.SubflowInfo{}
		}
		out.Connections = append(out.Connections, agentapi.PodConnection{ConnectionInfo: c, Subflows: subflows})
	}
	if mib, err := podMPTCPCounters(pod.NetNS); err != nil {
		out.CountersError = err.Error()
	} else {
		out.Counters = make(map[string]uint64, len(mib))
		for k, v := range mib {
			out.Counters[k] = uint64(v)
		}
	}
	for _, pm := range src.PathManagers() {
		if pm.Pod == agentName {
			out.PathManager = &agentapi.PathManagerInfo{Up: pm.Up, Restarts: pm.Restarts}
		}
	}
	stats, err := src.Datapath().Stats()
	if err != nil {
		return out, err
	}
	out.NodeJoinsRefused = stats[datapath.StatJoinRefused]
	return out, nil
}

// ServeLocalAPI serves src on <stateDir>/agent.sock until ctx ends; the
// returned function waits for the server to stop.
func ServeLocalAPI(ctx context.Context, src Source, stateDir string, log *slog.Logger) (string, func(), error) {
	return serveLocalAPI(ctx, src, log, filepath.Join(stateDir, LocalAPISocket), 0o600)
}

func serveLocalAPI(ctx context.Context, src Source, log *slog.Logger, path string, mode os.FileMode) (string, func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", nil, err
	}
	// A socket left by a killed agent: nobody listens on it any more.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return "", nil, fmt.Errorf("local API: %w", err)
	}
	// The directory is 0700, so the moment between bind and chmod gives
	// nobody else a way in.
	if err := os.Chmod(path, mode); err != nil {
		_ = ln.Close()
		return "", nil, err
	}
	srv := &http.Server{
		Handler:           localAPIHandler(src, log),
		ReadHeaderTimeout: 5 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if cred, err := peerCred(c); err == nil {
				return context.WithValue(ctx, peerKey{}, cred)
			}
			return ctx
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("local API stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return path, func() { <-done }, nil
}

// peerCred asks the kernel who connected: the credentials it recorded at
// connect(2), which the client cannot forge.
func peerCred(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// LocalAPIGet sends GET path to the local API of the agent whose state
// directory is stateDir and copies the answer's body to w. It is how the
// agent binary answers `agent -local-api-get PATH`, which `kubectl mptcp`
// runs in the agent's container through the API server (pods/exec): the
// API server authorizes the caller, and the socket stays root's alone.
func LocalAPIGet(ctx context.Context, stateDir, path string, w io.Writer) error {
	sock := filepath.Join(stateDir, LocalAPISocket)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("local API at %s: %w", sock, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("local API GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

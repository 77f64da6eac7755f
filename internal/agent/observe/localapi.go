package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
const LocalAPISocket = "agent.sock"

// SubflowInfo is one subflow as the local API reports it.
type SubflowInfo struct {
	Local  string `json:"local"`
	Remote string `json:"remote"`
	// Path is the path's name (empty when no path has that index any
	// more), PathIndex its index.
	Path      string `json:"path"`
	PathIndex uint32 `json:"pathIndex"`
	// Detour is the name of the path the subflow travels instead while
	// its own is down on one of the two nodes; empty when it travels its
	// own (docs/agent.md, "Failover").
	Detour string `json:"detour,omitempty"`
	// Role is "initiator" (a local pod opened it, this node chose the
	// path) or "responder" (mirrored from the NIC it arrived on).
	Role string `json:"role"`
	// Token is the MP_JOIN token (the receiver's), "" for an initial subflow.
	Token     string    `json:"token,omitempty"`
	Rule      string    `json:"rule"`
	RuleIndex uint32    `json:"ruleIndex"`
	Created   time.Time `json:"created"`
}

// ConnectionInfo is one connection as the local API reports it.
type ConnectionInfo struct {
	Local string `json:"local"`
	// Token is the responder's token, the connection's key on both nodes.
	Token string `json:"token"`
	// Paths are the names of the paths its subflows use.
	Paths []string `json:"paths"`
	// Joins counts the joins this node placed.
	Joins uint32 `json:"joins"`
	// TxBytes and RxBytes are what the local pod sent and received on the
	// connection, summed over its subflows still in the subflow table.
	// They are served here and not as metrics, which would have to name the
	// connection by its token (metrics_record.go).
	TxBytes uint64 `json:"txBytes"`
	RxBytes uint64 `json:"rxBytes"`
}

type peerKey struct{}

// localAPIHandler serves /v1/subflows and /v1/connections.
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

func subflowInfos(src Source) ([]SubflowInfo, error) {
	sfs, err := src.Datapath().Subflows()
	if err != nil {
		return nil, err
	}
	paths, rules := src.PathNames(), src.RuleNames()
	out := make([]SubflowInfo, 0, len(sfs))
	for _, s := range sfs {
		info := SubflowInfo{
			Local: s.Local.String(), Remote: s.Remote.String(),
			Path: paths[s.Path], PathIndex: s.Path, Role: roleName(s.Role),
			RuleIndex: s.Rule, Created: datapath.KtimeToTime(s.CreatedNs),
		}
		if s.Detour != 0 {
			info.Detour = paths[s.Detour]
		}
		if s.Token != 0 {
			info.Token = fmt.Sprintf("%08x", s.Token)
		}
		info.Rule = rules[s.Rule]
		out = append(out, info)
	}
	slices.SortFunc(out, func(x, y SubflowInfo) int {
		return strings.Compare(x.Local+x.Remote, y.Local+y.Remote)
	})
	return out, nil
}

func connectionInfos(src Source) ([]ConnectionInfo, error) {
	conns, err := src.Datapath().Connections()
	if err != nil {
		return nil, err
	}
	traffic, err := src.Datapath().ConnectionStats()
	if err != nil {
		return nil, err
	}
	paths := src.PathNames()
	out := make([]ConnectionInfo, 0, len(conns))
	for _, c := range conns {
		info := ConnectionInfo{Local: c.Local.String(), Token: fmt.Sprintf("%08x", c.Token), Joins: c.Joins, Paths: []string{}}
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
	slices.SortFunc(out, func(x, y ConnectionInfo) int { return strings.Compare(x.Local+x.Token, y.Local+y.Token) })
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

// Package apiload counts API requests server-side, from the kube-apiserver's audit log: who asked for what, how
// often. Client-side counters miss other processes; the audit log sees every client of the API server, told apart
// by user (a service account, or the harness's own client) and user agent.
package apiload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// policy logs every request at Metadata level (who, verb, object; no bodies). RequestReceived is left out, so an
// ordinary request writes one event (ResponseComplete) and a watch two (ResponseStarted when it opens,
// ResponseComplete when it ends).
const policy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
- RequestReceived
rules:
- level: Metadata
`

// Args writes the audit policy into dir and returns the kube-apiserver flags (for cluster.Options.APIServerArgs)
// that log every request as JSON lines to dir/audit.log (AuditLog). The log backend writes each event before the
// request goes on (audit-log-mode blocking, its default; batching is the webhook's default, not the log's);
// maxsize 0 never rotates (the default, 100 MB, would move events into backups Read does not open), and
// truncation (which drops events' fields) stays off.
func Args(dir string) (map[string][]string, error) { return ArgsFor(dir, policy) }

// ArgsFor is Args with another audit policy (audit.k8s.io/v1 Policy YAML): one that logs some resources at Request
// level puts their request bodies in Request.Body.
func ArgsFor(dir, policy string) (map[string][]string, error) {
	p := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(p, []byte(policy), 0o600); err != nil {
		return nil, err
	}
	return map[string][]string{
		"audit-policy-file":          {p},
		"audit-log-path":             {AuditLog(dir)},
		"audit-log-format":           {"json"},
		"audit-log-mode":             {"blocking"},
		"audit-log-maxsize":          {"0"},
		"audit-log-maxbackup":        {"0"},
		"audit-log-maxage":           {"0"},
		"audit-log-truncate-enabled": {"false"},
	}, nil
}

// AuditLog is where Args has the API server write its log.
func AuditLog(dir string) string { return filepath.Join(dir, "audit.log") }

// Request is one audit event: one request at one stage.
type Request struct {
	// AuditID is the same on every stage of one request.
	AuditID     string
	User        string
	UserAgent   string
	Verb        string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	// Stage is ResponseStarted (a watch opened), ResponseComplete or Panic.
	Stage string
	// At is when the API server received the request (the same on every stage).
	At time.Time
	// Watch is a watch request (verb watch, or list with watch=true as the API server names it).
	Watch bool
	// Code is the response's HTTP status (0 on a stage logged before the response, such as a watch's start).
	Code int
	// Body is the request's object (a patch, an update's object) where the policy logs at Request level.
	Body json.RawMessage
}

// event is the part of audit.k8s.io/v1 Event that Read uses.
type event struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceived time.Time       `json:"requestReceivedTimestamp"`
	RequestObject   json.RawMessage `json:"requestObject"`
}

// Read parses an audit log written with Args's flags, one event a line.
func Read(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Request
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		r := Request{AuditID: e.AuditID, User: e.User.Username, UserAgent: e.UserAgent, Verb: e.Verb,
			Stage: e.Stage, At: e.RequestReceived, Watch: e.Verb == "watch", Body: e.RequestObject}
		if e.ResponseStatus != nil {
			r.Code = e.ResponseStatus.Code
		}
		if o := e.ObjectRef; o != nil {
			r.Resource, r.Subresource, r.Namespace, r.Name = o.Resource, o.Subresource, o.Namespace, o.Name
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// Row is one client's requests of one verb: a user, and the program its user agent names (processes that share
// a user, as the local control plane's do, tell themselves apart by it).
type Row struct {
	User  string
	Agent string
	Verb  string
	// Count is the number of requests received in the window; a watch counts once, when it opened, however long
	// it stays open and however many events it carries.
	Count int
	// PerSecond is Count over the window's length.
	PerSecond float64
}

// Summary is the requests received in [From, To), by client and verb, the busiest first.
type Summary struct {
	From, To time.Time
	Rows     []Row
}

// Summarize counts each request once (by audit ID, whatever stages were logged) when it was received in [from,
// to), grouped by user, user agent program (Agent) and verb.
func Summarize(reqs []Request, from, to time.Time) Summary {
	s := Summary{From: from, To: to}
	secs := to.Sub(from).Seconds()
	seen := map[string]bool{}
	idx := map[[3]string]int{}
	for _, r := range reqs {
		if r.At.Before(from) || !r.At.Before(to) {
			continue
		}
		if r.AuditID != "" {
			if seen[r.AuditID] {
				continue
			}
			seen[r.AuditID] = true
		}
		agent, _, _ := strings.Cut(r.UserAgent, "/")
		k := [3]string{r.User, agent, r.Verb}
		i, ok := idx[k]
		if !ok {
			i = len(s.Rows)
			idx[k] = i
			s.Rows = append(s.Rows, Row{User: r.User, Agent: agent, Verb: r.Verb})
		}
		s.Rows[i].Count++
	}
	for i := range s.Rows {
		if secs > 0 {
			s.Rows[i].PerSecond = float64(s.Rows[i].Count) / secs
		}
	}
	sort.Slice(s.Rows, func(i, j int) bool {
		a, b := s.Rows[i], s.Rows[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		if a.User != b.User {
			return a.User < b.User
		}
		if a.Agent != b.Agent {
			return a.Agent < b.Agent
		}
		return a.Verb < b.Verb
	})
	return s
}

// Refused counts the requests received in [from, to) that were answered code (409: a conflict, a write sent with a
// resourceVersion another writer had replaced), by user agent program, verb and resource: "driver-upgrade-gate update
// leases".
func Refused(reqs []Request, from, to time.Time, code int) map[string]int {
	out := map[string]int{}
	for _, r := range reqs {
		if r.Code != code || r.At.Before(from) || !r.At.Before(to) {
			continue
		}
		agent, _, _ := strings.Cut(r.UserAgent, "/")
		out[agent+" "+r.Verb+" "+r.Resource]++
	}
	return out
}

// Total is the number of requests in the summary; users narrows it to users whose name has one of these
// prefixes (none: all).
func (s Summary) Total(users ...string) int {
	n := 0
	for _, r := range s.Rows {
		if matches(r.User, users) {
			n += r.Count
		}
	}
	return n
}

// Agent narrows the summary to rows whose Agent is agent.
func (s Summary) Agent(agent string) Summary {
	out := Summary{From: s.From, To: s.To}
	for _, r := range s.Rows {
		if r.Agent == agent {
			out.Rows = append(out.Rows, r)
		}
	}
	return out
}

// Verbs is the count of each verb for users with one of these prefixes (none: all).
func (s Summary) Verbs(users ...string) map[string]int {
	out := map[string]int{}
	for _, r := range s.Rows {
		if matches(r.User, users) {
			out[r.Verb] += r.Count
		}
	}
	return out
}

func matches(user string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(user, p) {
			return true
		}
	}
	return false
}

// String is a table: user, agent, verb, count and rate.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests received in %s (a watch counts once, when it opened)\n", s.To.Sub(s.From).Round(time.Millisecond))
	for _, r := range s.Rows {
		fmt.Fprintf(&b, "%-50s %-24s %-8s %6d %8.2f/s\n", r.User, r.Agent, r.Verb, r.Count, r.PerSecond)
	}
	return b.String()
}

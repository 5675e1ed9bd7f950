package membermock

import (
	"maps"
	"net/http"
	"sync"

	"k8s.io/apimachinery/pkg/util/sets"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/mci-dev/mci/pkg/apis/inference"
)

// Reads are the LISTs and WATCHes readers sent for summaries. A watch that
// asks for its initial events (a streaming list) is a LIST here: it
// costs the member what a LIST does.
type Reads struct {
	Lists, Watches int
}

// readCounts counts the summary reads per member.
type readCounts struct {
	mu       sync.Mutex
	byMember map[string]Reads
}

var requestInfos = &genericapirequest.RequestInfoFactory{
	APIPrefixes:          sets.NewString("api", "apis"),
	GrouplessAPIPrefixes: sets.NewString("api"),
}

func (c *readCounts) count(m *served, r *http.Request) {
	info, err := requestInfos.NewRequestInfo(r)
	if err != nil || !info.IsResourceRequest || info.APIGroup != inference.GroupName {
		return
	}
	lists := info.Verb == "list" || (info.Verb == "watch" && r.URL.Query().Get("sendInitialEvents") == "true")
	watches := info.Verb == "watch" && !lists
	if !lists && !watches {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byMember == nil {
		c.byMember = map[string]Reads{}
	}
	reads := c.byMember[m.name]
	if lists {
		reads.Lists++
	} else {
		reads.Watches++
	}
	c.byMember[m.name] = reads
}

// Reads returns the summary reads each member was sent since the fleet
// started, by member name.
func (f *Fleet) Reads() map[string]Reads {
	f.reads.mu.Lock()
	defer f.reads.mu.Unlock()
	return maps.Clone(f.reads.byMember)
}

package daemon

import (
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdp-onload/onload/stack"
)

// Metrics is the daemon's state for Prometheus (onloadd serve -metrics):
// every stack's engine counters (read from its image, under a lock taken
// only if free, as stackdump does), and the daemon's own gauges.
func (d *Daemon) Metrics() prometheus.Collector { return metrics{d} }

type metrics struct{ d *Daemon }

var (
	stackLabels = []string{"stack", "name", "interface", "queue"}
	descStacks  = prometheus.NewDesc("onload_stacks", "Stacks onloadd serves.", nil, nil)
	descClients = prometheus.NewDesc("onload_clients", "Processes connected to onloadd's control socket.", nil, nil)
	descFilters = prometheus.NewDesc("onload_stack_filters", "Ports steered to the stack.", stackLabels, nil)
	descProcs   = prometheus.NewDesc("onload_stack_processes", "Processes that use the stack.", stackLabels, nil)
	// One counter family per field of stack.Counters, in Prometheus's
	// names: RxTCPBadChecksum becomes onload_rx_tcp_bad_checksum_total.
	counterDescs = func() []*prometheus.Desc {
		t := reflect.TypeOf(stack.Counters{})
		out := make([]*prometheus.Desc, t.NumField())
		for i := range out {
			f := t.Field(i)
			out[i] = prometheus.NewDesc("onload_"+snake(f.Name)+"_total", "The engine's "+f.Name+" counter.", stackLabels, nil)
		}
		return out
	}()
)

// snake turns a Go name into a Prometheus one: TCPSynCookiesOK becomes
// tcp_syn_cookies_ok.
func snake(name string) string {
	var b strings.Builder
	r := []rune(name)
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

func (m metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descStacks
	ch <- descClients
	ch <- descFilters
	ch <- descProcs
	for _, d := range counterDescs {
		ch <- d
	}
}

func (m metrics) Collect(ch chan<- prometheus.Metric) {
	d := m.d
	d.mu.Lock()
	defer d.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descStacks, prometheus.GaugeValue, float64(len(d.stacks)))
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(len(d.clients)))
	for _, s := range d.stacks {
		labels := []string{strconv.Itoa(int(s.id)), s.name, s.ifc.name, strconv.Itoa(s.queue)}
		ch <- prometheus.MustNewConstMetric(descFilters, prometheus.GaugeValue, float64(len(s.filters)), labels...)
		ch <- prometheus.MustNewConstMetric(descProcs, prometheus.GaugeValue, float64(len(s.clients)), labels...)
		c, ok := s.st.TryCounters()
		if !ok {
			continue
		}
		v := reflect.ValueOf(c)
		for i, desc := range counterDescs {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v.Field(i).Uint()), labels...)
		}
	}
}

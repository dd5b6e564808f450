// Command scale-load fills and stirs the API server of the scale bench (scripts/kube-scale.sh)
// through client-go, with many requests in flight so that 150k pods go in within minutes.
//
//	scale-load load  --kubeconfig K --objects FILE --nodes N [--workers W]
//	    Nodes node-0 … node-(N-1) for kwok (its annotation, a /24 podCIDR each, from which
//	    kwok gives the pods their IPs), then every object of FILE (JSON lines written by
//	    `cargo bench --bench kube_real -- emit`: namespaces, NetworkPolicies, pods without
//	    status, in that order; each kind finished before the next starts, so a policy never
//	    names a namespace that is not there yet), then waits until kwok has made every pod
//	    Running (with an IP) and has stopped writing pod statuses (under one pod event a
//	    second for 10 s; at most 30 min, then said). Prints what it created and how long
//	    each kind took.
//	scale-load churn --kubeconfig K --rate R --seconds S --nodes N --namespaces NS
//	    Churn for S seconds, R starts a second: each start is a churn pod's life (created,
//	    then kwok gives it an IP and marks it Running; relabelled 1 s later with another app;
//	    deleted 1 s after that), or, every tenth, a NetworkPolicy edit (its pod selector's
//	    app changes). So about 2.8 R writes a second, each followed by one or two status
//	    writes of kwok's. Prints the writes done, their rate and the failures; the exit
//	    status is 1 if any write failed.
//	scale-load probe --kubeconfig K
//	    The writer half of the event → enforced probe (benches/kube_real.rs reads the other
//	    half, the agent's IP sets). Commands on standard input, one answer line each:
//	      template IP...  the first of these addresses that is a Running pod's on another node
//	                      than node-0: "template NS NAME IP", or "none"
//	      add ID IP       a pod probe-ID copied from the template (namespace, labels, ports) on
//	                      node "probe-node", which kwok does not manage, then its status written
//	                      here: Running, with address IP: "added ID T0 T1"
//	      del ID          probe-ID deleted at once (grace period 0): "deleted ID T0 T1"
//	    T0 and T1 are the Unix times in nanoseconds just before the write that makes the
//	    change (the status write; the delete) and when its answer came. A failed request is
//	    "error ..." and ends nothing: the bench counts it.
//
// Guarantees: every request error is counted and printed (the first few in full); the exit
// status is 1 if any create failed, so a half-loaded cluster is never measured as a full one.
// Nothing here decides what the cluster looks like: the objects come from the Rust generator
// (benches/support/synthetic.rs), the only place the synthetic cluster is defined.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: scale-load load|churn|probe [options] (see the header of main.go)")
	}
	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server")
	objects := fs.String("objects", "", "JSON lines of the synthetic cluster (load)")
	nodes := fs.Int("nodes", 50, "nodes node-0 … node-(N-1)")
	workers := fs.Int("workers", 64, "requests in flight")
	rate := fs.Float64("rate", 10, "churn starts a second (pod lives and policy edits)")
	seconds := fs.Float64("seconds", 60, "churn duration")
	namespaces := fs.Int("namespaces", 50, "namespaces ns-0 … of the synthetic cluster (churn)")
	policies := fs.Int("policies", 100, "NetworkPolicies pol-0 … of the synthetic cluster (churn)")
	_ = fs.Parse(args)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	// Client-side rate limits off: the point is to find out how fast the server takes them.
	cfg.QPS = -1
	cfg.Burst = 0
	cfg.UserAgent = "netpol-scale-load"
	// Protobuf, as kubelets and controllers speak: cheaper for the server than JSON.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail("client: %v", err)
	}
	ctx := context.Background()
	switch cmd {
	case "load":
		load(ctx, client, *objects, *nodes, *workers)
	case "churn":
		churn(ctx, client, *rate, *seconds, *nodes, *namespaces, *policies)
	case "probe":
		probe(ctx, client, os.Stdin, os.Stdout)
	default:
		fail("unknown command %q: load, churn or probe", cmd)
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "scale-load: "+format+"\n", a...)
	os.Exit(1)
}

// errors counts failed requests and prints the first few in full.
type errors struct{ n atomic.Int64 }

func (e *errors) add(what string, err error) {
	if e.n.Add(1) <= 5 {
		fmt.Fprintf(os.Stderr, "scale-load: %s: %v\n", what, err)
	}
}

// parallel runs f on every item with `workers` goroutines.
func parallel[T any](items []T, workers int, f func(T)) {
	ch := make(chan T)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				f(it)
			}
		}()
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
}

// podCIDR of node i: 10.128.0.0/9 cut in /24s, clear of the bench's own 10.99.0.0/16 (the
// agents' links) and of the generator's 10.0.0.0/9 pod addresses, which kwok replaces.
func podCIDR(i int) string {
	return fmt.Sprintf("10.%d.%d.0/24", 128+(i>>8)&0x7f, i&0xff)
}

func load(ctx context.Context, c *kubernetes.Clientset, file string, nodes, workers int) {
	var errs errors
	start := time.Now()
	idx := make([]int, nodes)
	for i := range idx {
		idx[i] = i
	}
	parallel(idx, workers, func(i int) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("node-%d", i),
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": fmt.Sprintf("node-%d", i)},
		}, Spec: corev1.NodeSpec{PodCIDR: podCIDR(i), PodCIDRs: []string{podCIDR(i)}}}
		if _, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			errs.add("node "+n.Name, err)
		}
	})
	fmt.Printf("nodes: %d in %.1f s\n", nodes, time.Since(start).Seconds())

	f, err := os.Open(file)
	if err != nil {
		fail("%v", err)
	}
	defer f.Close()
	byKind := map[string][][]byte{}
	var order []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := append([]byte(nil), sc.Bytes()...)
		var head struct{ Kind string }
		if err := json.Unmarshal(line, &head); err != nil {
			fail("%s: %v", file, err)
		}
		if _, ok := byKind[head.Kind]; !ok {
			order = append(order, head.Kind)
		}
		byKind[head.Kind] = append(byKind[head.Kind], line)
	}
	if err := sc.Err(); err != nil {
		fail("%s: %v", file, err)
	}
	for _, kind := range order {
		t := time.Now()
		parallel(byKind[kind], workers, func(line []byte) { create(ctx, c, kind, line, &errs) })
		d := time.Since(t).Seconds()
		fmt.Printf("%s: %d in %.1f s (%.0f/s)\n", strings.ToLower(kind)+"s", len(byKind[kind]), d,
			float64(len(byKind[kind]))/d)
	}
	if n := errs.n.Load(); n > 0 {
		fail("%d creates failed", n)
	}
	// Done when no pod is left outside Running: a field-selected list of one item that comes
	// back empty. Never the whole list of pending pods every two seconds: at 150k pods that
	// was tens of thousands of pods encoded per poll, which slowed kwok's status writes.
	t := time.Now()
	for {
		l, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running", Limit: 1})
		if err == nil && len(l.Items) == 0 {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale-load: looking for pods not Running: %v\n", err)
		}
		if time.Since(t) > 60*time.Minute {
			fail("%d pods not Running after 60 min (kwok's log says why)", count(ctx, c, "status.phase!=Running"))
		}
		time.Sleep(5 * time.Second)
	}
	fmt.Printf("pods Running (kwok): %.1f s after the last create; all loaded in %.1f s\n",
		time.Since(t).Seconds(), time.Since(start).Seconds())
	settle(ctx, c)
}

// settleWindow and settleQuiet: the cluster is at rest once a window of pod watch events
// holds fewer than settleQuiet of them (under one a second).
const (
	settleWindow = 10 * time.Second
	settleQuiet  = 10
	settleLimit  = 30 * time.Minute
)

// settle waits until kwok stops writing pod statuses. Every pod Running is not the end of its
// writes: at 150k pods its pod-ready stage races itself and retries refused patches for many
// minutes, and each retry that succeeds reaches every watcher, so a round measured then would
// call kwok's writes the agents' rest. Watches from the current resource version (no list) in
// windows of 10 s; after 30 min it says so and returns, so the report's rounds are read with
// the events per second each prints.
func settle(ctx context.Context, c *kubernetes.Clientset) {
	t := time.Now()
	last := "no complete window"
	for {
		n, err := podEvents(ctx, c, settleWindow)
		if err == nil {
			last = fmt.Sprintf("%d pod events in the last complete %.0f s", n, settleWindow.Seconds())
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale-load: watching pods to see kwok settle: %v\n", err)
			time.Sleep(time.Second)
		} else if n < settleQuiet {
			fmt.Printf("kwok settled: %d pod events in the last %.0f s, %.1f s after all were Running\n",
				n, settleWindow.Seconds(), time.Since(t).Seconds())
			return
		}
		if time.Since(t) > settleLimit {
			fmt.Printf("kwok NOT settled after %.0f min (%s); the rounds' rest includes its writes\n",
				settleLimit.Minutes(), last)
			return
		}
	}
}

// podEvents counts the pod watch events of the next `window`, from the current resource
// version (a list of one pod gives it). A watch that ends early (an ERROR event such as 410,
// a dropped connection) is an error, never a quiet window.
func podEvents(ctx context.Context, c *kubernetes.Clientset, window time.Duration) (int, error) {
	l, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	secs := int64(window.Seconds())
	start := time.Now()
	w, err := c.CoreV1().Pods("").Watch(wctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion, TimeoutSeconds: &secs})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	n := 0
	for e := range w.ResultChan() {
		if e.Type == watch.Error {
			return 0, fmt.Errorf("watch error: %v", e.Object)
		}
		n++
	}
	if d := time.Since(start); d < window*9/10 {
		return 0, fmt.Errorf("watch ended after %.1f s of %.0f", d.Seconds(), window.Seconds())
	}
	return n, nil
}

// count of the pods matching a field selector, page by page; -1 if the server did not answer.
func count(ctx context.Context, c *kubernetes.Clientset, selector string) int {
	n, cont := 0, ""
	for {
		l, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: selector, Limit: 5000, Continue: cont})
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale-load: counting pods: %v\n", err)
			return -1
		}
		n += len(l.Items)
		if cont = l.Continue; cont == "" {
			return n
		}
	}
}

func create(ctx context.Context, c *kubernetes.Clientset, kind string, line []byte, errs *errors) {
	var err error
	var name string
	switch kind {
	case "Namespace":
		var o corev1.Namespace
		if err = json.Unmarshal(line, &o); err == nil {
			name = o.Name
			_, err = c.CoreV1().Namespaces().Create(ctx, &o, metav1.CreateOptions{})
		}
	case "NetworkPolicy":
		var o networkingv1.NetworkPolicy
		if err = json.Unmarshal(line, &o); err == nil {
			name = o.Namespace + "/" + o.Name
			_, err = c.NetworkingV1().NetworkPolicies(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		}
	case "Pod":
		var o corev1.Pod
		if err = json.Unmarshal(line, &o); err == nil {
			name = o.Namespace + "/" + o.Name
			_, err = c.CoreV1().Pods(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
		}
	default:
		err = fmt.Errorf("kind %q is not one the loader creates", kind)
	}
	if err != nil {
		errs.add(kind+" "+name, err)
	}
}

func churn(ctx context.Context, c *kubernetes.Clientset, rate, seconds float64, nodes, namespaces, policies int) {
	var errs errors
	var ops atomic.Int64
	// Seeded by the clock: a fixed seed would replay the last run's policy edits, which are
	// then no-ops (the same value again) and reach no watcher.
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	var mu sync.Mutex // rng is not safe for concurrent use
	pick := func(n int) int { mu.Lock(); defer mu.Unlock(); return rng.Intn(n) }
	patch := func(app string) []byte {
		return []byte(fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app))
	}
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for k := 0; time.Now().Before(end); k++ {
		<-tick.C
		if k%10 == 9 && policies > 0 {
			// A policy edit: its pod selector picks another app.
			p := pick(policies)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ns := fmt.Sprintf("ns-%d", p%namespaces)
				body := []byte(fmt.Sprintf(`{"spec":{"podSelector":{"matchLabels":{"app":"app-%d"}}}}`, pick(50)))
				if _, err := c.NetworkingV1().NetworkPolicies(ns).Patch(ctx, fmt.Sprintf("pol-%d", p),
					types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
					errs.add("policy edit", err)
				}
				ops.Add(1)
			}()
			continue
		}
		// A pod's life, one operation a second: create, relabel, delete.
		ns := fmt.Sprintf("ns-%d", pick(namespaces))
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name:      fmt.Sprintf("churn-%d", k),
				Namespace: ns,
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", pick(50)),
					"tier": []string{"web", "api", "db"}[k%3], "version": fmt.Sprintf("v%d", k%5)},
			},
			Spec: corev1.PodSpec{
				NodeName:   fmt.Sprintf("node-%d", pick(nodes)),
				Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10.2"}},
			},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods := c.CoreV1().Pods(ns)
			if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs.add("churn create", err)
				return
			}
			ops.Add(1)
			time.Sleep(time.Second)
			if _, err := pods.Patch(ctx, pod.Name, types.MergePatchType,
				patch(fmt.Sprintf("app-%d", pick(50))), metav1.PatchOptions{}); err != nil {
				errs.add("churn relabel", err)
			}
			ops.Add(1)
			time.Sleep(time.Second)
			if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
				errs.add("churn delete", err)
			}
			ops.Add(1)
		}()
	}
	wg.Wait()
	fmt.Printf("churn: %d writes in %.1f s (%.1f/s) at %.0f starts/s; %d failed\n",
		ops.Load(), time.Since(end.Add(-time.Duration(seconds*float64(time.Second)))).Seconds(),
		float64(ops.Load())/seconds, rate, errs.n.Load())
	if errs.n.Load() > 0 {
		os.Exit(1)
	}
}

// probe answers the bench's commands (see the header) until its standard input ends.
func probe(ctx context.Context, c *kubernetes.Clientset, in io.Reader, out io.Writer) {
	var template *corev1.Pod
	sc := bufio.NewScanner(in)
	w := bufio.NewWriter(out)
	say := func(format string, a ...any) {
		fmt.Fprintf(w, format+"\n", a...)
		_ = w.Flush()
	}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "template":
			template = nil
			var chosen string
			for _, ip := range f[1:] {
				l, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.podIP=" + ip})
				if err != nil {
					say("error template: %v", err)
					break
				}
				for i := range l.Items {
					p := &l.Items[i]
					if p.Spec.NodeName != "node-0" && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
						template, chosen = p, ip
						break
					}
				}
				if template != nil {
					break
				}
			}
			if template == nil {
				say("none")
			} else {
				say("template %s %s %s", template.Namespace, template.Name, chosen)
			}
		case f[0] == "add" && len(f) == 3 && template != nil:
			pods := c.CoreV1().Pods(template.Namespace)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "probe-" + f[1], Namespace: template.Namespace, Labels: template.Labels},
				Spec: corev1.PodSpec{
					NodeName:   "probe-node",
					Containers: template.Spec.Containers,
				},
			}
			created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				say("error add: %v", err)
				continue
			}
			created.Status = corev1.PodStatus{
				Phase:  corev1.PodRunning,
				PodIP:  f[2],
				PodIPs: []corev1.PodIP{{IP: f[2]}},
			}
			t0 := time.Now()
			if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				say("error add status: %v", err)
				continue
			}
			say("added %s %d %d", f[1], t0.UnixNano(), time.Now().UnixNano())
		case f[0] == "del" && len(f) == 2 && template != nil:
			zero := int64(0)
			t0 := time.Now()
			if err := c.CoreV1().Pods(template.Namespace).Delete(ctx, "probe-"+f[1],
				metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				say("error del: %v", err)
				continue
			}
			say("deleted %s %d %d", f[1], t0.UnixNano(), time.Now().UnixNano())
		default:
			say("error: %q is not a command here (a template first)", sc.Text())
		}
	}
}

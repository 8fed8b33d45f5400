package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	bolt "go.etcd.io/bbolt"

	"github.com/mqlet/mqlet/cri"
)

var _ cri.ObjectSource = (*Store)(nil)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func openTest(t *testing.T, path string, opts Options) *Store {
	t.Helper()
	s, err := OpenWith(path, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newStore(t *testing.T) (*Store, *clock) {
	c := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	return openTest(t, filepath.Join(t.TempDir(), "state.db"), Options{Now: c.Now}), c
}

func pod(ns, name, image string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: image}}},
	}
}

func configMap(name, value string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": value}}
}

func secret(name, value string) *v1.Secret {
	return &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"password": value}}
}

func actions(changes []Change) string {
	var parts []string
	for _, c := range changes {
		parts = append(parts, fmt.Sprintf("%s %s %s", c.Kind, c.Key, c.Action))
	}
	return strings.Join(parts, "; ")
}

func mustApply(t *testing.T, s *Store, objs ...runtime.Object) []Change {
	t.Helper()
	ch, err := s.Apply(objs)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return ch
}

func TestApplyCreatedUpdatedUnchanged(t *testing.T) {
	s, _ := newStore(t)
	ch := mustApply(t, s, pod("", "web", "nginx:1"), configMap("cfg", "a"), secret("sec", "x"))
	if got, want := actions(ch), "Pod default/web created; ConfigMap default/cfg created; Secret default/sec created"; got != want {
		t.Fatalf("first apply: %s, want %s", got, want)
	}
	ch = mustApply(t, s, pod("", "web", "nginx:1"), configMap("cfg", "a"), secret("sec", "x"))
	if got, want := actions(ch), "Pod default/web unchanged; ConfigMap default/cfg unchanged; Secret default/sec unchanged"; got != want {
		t.Fatalf("identical re-apply: %s, want %s", got, want)
	}
	ch = mustApply(t, s, pod("", "web", "nginx:2"), configMap("cfg", "b"), secret("sec", "x"))
	if got, want := actions(ch), "Pod default/web updated; ConfigMap default/cfg updated; Secret default/sec unchanged"; got != want {
		t.Fatalf("changed apply: %s, want %s", got, want)
	}
	cm, err := s.ConfigMap("default", "cfg")
	if err != nil || cm.Data["k"] != "b" {
		t.Fatalf("ConfigMap = %v, %v", cm, err)
	}
	sec, err := s.Secret("", "sec")
	if err != nil || string(sec.Data["password"]) != "x" || sec.StringData != nil {
		t.Fatalf("Secret = %+v, %v (stringData must be merged into data)", sec, err)
	}
	if _, err := s.Secret("default", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing secret: %v, want ErrNotFound", err)
	}
}

func TestPodGenerationUIDAndCreationTimestamp(t *testing.T) {
	s, c := newStore(t)
	mustApply(t, s, pod("edge", "web", "nginx:1"))
	first, err := s.Pod("edge", "web")
	if err != nil {
		t.Fatal(err)
	}
	if first.UID == "" || first.Generation != 1 || !first.CreationTimestamp.Time.Equal(c.Now()) {
		t.Fatalf("first store: uid %q generation %d created %v", first.UID, first.Generation, first.CreationTimestamp)
	}
	if first.Kind != "Pod" || first.APIVersion != "v1" {
		t.Fatalf("TypeMeta not set: %+v", first.TypeMeta)
	}

	c.Advance(time.Hour)
	// Label change only: updated, same generation.
	p := pod("edge", "web", "nginx:1")
	p.Labels["tier"] = "front"
	p.Status.Phase = v1.PodRunning // status is not desired state
	if got := actions(mustApply(t, s, p)); got != "Pod edge/web updated" {
		t.Fatalf("label change: %s", got)
	}
	second, _ := s.Pod("edge", "web")
	if second.Generation != 1 || second.UID != first.UID || !second.CreationTimestamp.Equal(&first.CreationTimestamp) || second.Status.Phase != "" {
		t.Fatalf("after label change: %+v", second.ObjectMeta)
	}

	// Spec change: generation 2, same uid; applying it again stays at 2.
	for i := 0; i < 2; i++ {
		p = pod("edge", "web", "nginx:2")
		p.Labels["tier"] = "front"
		mustApply(t, s, p)
	}
	third, _ := s.Pod("edge", "web")
	if third.Generation != 2 || third.UID != first.UID {
		t.Fatalf("after spec change: generation %d uid %q", third.Generation, third.UID)
	}

	// Senders cannot set generation or creationTimestamp.
	p = third.DeepCopy()
	p.Generation = 99
	p.CreationTimestamp = metav1.NewTime(time.Unix(0, 0))
	if got := actions(mustApply(t, s, p)); got != "Pod edge/web unchanged" {
		t.Fatalf("re-apply of stored pod: %s", got)
	}

	// Repeating the stored uid is fine (a get result applied again).
	p = third.DeepCopy()
	if got := actions(mustApply(t, s, p)); got != "Pod edge/web unchanged" {
		t.Fatalf("re-apply with the stored uid: %s", got)
	}
}

// TestClientUIDsAreRefused covers every way a client uid is refused: not a
// UUID (a path), another object's uid (any namespace), a uid that differs
// from the stored one, any uid for a new object. Nothing is stored.
func TestClientUIDsAreRefused(t *testing.T) {
	s, _ := newStore(t)
	mustApply(t, s, pod("edge", "victim", "x:1"), configMap("cfg", "a"))
	victim, _ := s.Pod("edge", "victim")
	cm, _ := s.ConfigMap("default", "cfg")
	cases := []struct {
		name string
		obj  runtime.Object
		want string
	}{
		{"path", withUID(pod("edge", "a", "x:1"), "../../x"), `"../../x" is not a UUID`},
		{"uppercase UUID", withUID(pod("edge", "a", "x:1"), strings.ToUpper(string(victim.UID))), "is not a UUID"},
		{"another pod's", withUID(pod("other", "a", "x:1"), string(victim.UID)), "belongs to Pod edge/victim"},
		{"differs from stored", withUID(pod("edge", "victim", "x:1"), "0b7e6a42-6c1e-4d0b-9a8e-1f2d3c4b5a69"), "differs from the stored uid"},
		{"new object", withUID(pod("edge", "b", "x:1"), "0b7e6a42-6c1e-4d0b-9a8e-1f2d3c4b5a69"), "given for a new object"},
		{"another configmap's", withUID(configMap("cfg2", "b"), string(cm.UID)), "belongs to ConfigMap default/cfg"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Apply([]runtime.Object{c.obj})
			var re *RejectedError
			if !errors.As(err, &re) || re.Field != "metadata.uid" || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Apply = %v, want a metadata.uid rejection containing %q", err, c.want)
			}
			if _, err := s.Replace([]runtime.Object{c.obj}, Scope{}); !errors.As(err, &re) {
				t.Fatalf("Replace = %v, want the same rejection", err)
			}
		})
	}
	pods, _ := s.ListPods()
	if len(pods) != 1 || pods[0].UID != victim.UID {
		t.Fatalf("a refused uid changed the store: %+v", pods)
	}
}

func withUID(obj runtime.Object, uid string) runtime.Object {
	metaOf(obj).UID = types.UID(uid)
	return obj
}

// TestOpenMigratesNonUUIDs: a store written by an older mqlet that kept
// client uids gets fresh UUIDs at open.
func TestOpenMigratesNonUUIDs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, pod("edge", "old", "x:1"), pod("edge", "fine", "x:1"))
	fine, _ := s.Pod("edge", "fine")
	// Write a non-UUID uid the way an older version stored it.
	err = s.db.Update(func(tx *bolt.Tx) error {
		p := pod("edge", "old", "x:1")
		p.UID, p.Generation = "../../x", 4
		raw, _ := json.Marshal(p)
		return tx.Bucket(bucketPods).Put([]byte("edge/old"), raw)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, path, Options{})
	old, _ := s.Pod("edge", "old")
	if !IsUID(string(old.UID)) || old.Generation != 1 {
		t.Fatalf("migrated pod uid %q generation %d", old.UID, old.Generation)
	}
	if again, _ := s.Pod("edge", "fine"); again.UID != fine.UID {
		t.Fatalf("a UUID was changed by the migration: %q -> %q", fine.UID, again.UID)
	}
	if m := s.MigratedUIDs(); len(m) != 1 || !strings.Contains(m[0], `Pod edge/old: "../../x"`) {
		t.Fatalf("MigratedUIDs = %q", m)
	}
}

func TestQuarantineRoundTrip(t *testing.T) {
	s, _ := newStore(t)
	if _, ok, err := s.GetQuarantine("edge/web"); ok || err != nil {
		t.Fatalf("empty store has a quarantine: %v %v", ok, err)
	}
	q := Quarantine{UID: "u1", Generation: 2, Reason: "r", Since: time.Unix(100, 0).UTC()}
	if err := s.SetQuarantine("edge/web", q); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.GetQuarantine("edge/web")
	if err != nil || !ok || got != q || !got.Covers("u1", 2) || got.Covers("u1", 3) || got.Covers("u2", 2) {
		t.Fatalf("GetQuarantine = %+v %v %v", got, ok, err)
	}
	if err := s.LiftQuarantine("edge/web"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.GetQuarantine("edge/web"); ok {
		t.Fatal("quarantine not lifted")
	}
}

func TestUIDsDifferPerPod(t *testing.T) {
	s, _ := newStore(t)
	mustApply(t, s, pod("", "a", "x:1"), pod("", "b", "x:1"))
	pods, err := s.ListPods()
	if err != nil || len(pods) != 2 {
		t.Fatalf("ListPods = %d, %v", len(pods), err)
	}
	if pods[0].UID == pods[1].UID || len(pods[0].UID) != 36 {
		t.Fatalf("uids %q %q", pods[0].UID, pods[1].UID)
	}
}

func TestPersistenceAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, s, pod("", "web", "nginx:1"), configMap("cfg", "a"), secret("sec", "x"))
	if err := s.RecordReply("req-1", []byte(`{"phase":"succeeded"}`), time.Now()); err != nil {
		t.Fatal(err)
	}
	seq1, _ := s.NextSeq()
	if err := s.SetMeta("bootId", []byte("b1")); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Pod("default", "web")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTest(t, path, Options{})
	after, err := s.Pod("default", "web")
	if err != nil || after.UID != before.UID || after.Spec.Containers[0].Image != "nginx:1" {
		t.Fatalf("pod after reopen: %+v, %v", after, err)
	}
	cms, _ := s.ListConfigMaps()
	secs, _ := s.ListSecrets()
	if len(cms) != 1 || len(secs) != 1 {
		t.Fatalf("after reopen: %d config maps, %d secrets", len(cms), len(secs))
	}
	if r, ok, err := s.LookupReply("req-1"); err != nil || !ok || string(r) != `{"phase":"succeeded"}` {
		t.Fatalf("reply after reopen: %q %v %v", r, ok, err)
	}
	if seq2, _ := s.NextSeq(); seq2 != seq1+1 {
		t.Fatalf("seq after reopen %d, want %d", seq2, seq1+1)
	}
	if v, ok, _ := s.Meta("bootId"); !ok || string(v) != "b1" {
		t.Fatalf("meta after reopen: %q %v", v, ok)
	}
	if got := actions(mustApply(t, s, pod("", "web", "nginx:1"))); got != "Pod default/web unchanged" {
		t.Fatalf("re-apply after reopen: %s", got)
	}
}

func TestReplace(t *testing.T) {
	s, _ := newStore(t)
	mustApply(t, s, pod("", "keep", "x:1"), pod("", "gone", "x:1"), configMap("cfg", "a"), secret("sec", "x"))
	ch, err := s.Replace([]runtime.Object{pod("", "keep", "x:1"), pod("", "new", "x:1"), configMap("cfg", "b")}, Scope{})
	if err != nil {
		t.Fatal(err)
	}
	want := "Pod default/keep unchanged; Pod default/new created; ConfigMap default/cfg updated; Pod default/gone deleted; Secret default/sec deleted"
	if got := actions(ch); got != want {
		t.Fatalf("Replace: %s\nwant %s", got, want)
	}
	if ch[3].Object.(*v1.Pod).Name != "gone" {
		t.Fatalf("deleted change carries %v", ch[3].Object)
	}
	pods, _ := s.ListPods()
	if len(pods) != 2 || pods[0].Name != "keep" || pods[1].Name != "new" {
		t.Fatalf("pods after Replace: %v", pods)
	}
}

func TestReplaceIsAtomic(t *testing.T) {
	s, _ := newStore(t)
	mustApply(t, s, pod("", "a", "x:1"), configMap("cfg", "a"))
	bad := []runtime.Object{pod("", "a", "x:2"), &v1.Pod{}} // the second has no name
	if _, err := s.Replace(bad, Scope{}); err == nil || !strings.Contains(err.Error(), "object 2") {
		t.Fatalf("Replace with a nameless pod: %v", err)
	}
	dup := []runtime.Object{pod("", "a", "x:2"), pod("default", "a", "x:3")}
	if _, err := s.Replace(dup, Scope{}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("Replace with a duplicate: %v", err)
	}
	if _, err := s.Apply([]runtime.Object{configMap("cfg", "z"), &v1.Service{}}); err == nil {
		t.Fatal("Apply accepted a Service")
	}
	p, _ := s.Pod("", "a")
	cm, _ := s.ConfigMap("", "cfg")
	if p.Spec.Containers[0].Image != "x:1" || cm.Data["k"] != "a" {
		t.Fatalf("a failed write changed the state: image %s, data %v", p.Spec.Containers[0].Image, cm.Data)
	}
	cms, _ := s.ListConfigMaps()
	if len(cms) != 1 {
		t.Fatalf("config maps: %d", len(cms))
	}
}

func TestDeleteAndGet(t *testing.T) {
	s, _ := newStore(t)
	mustApply(t, s, pod("edge", "web", "x:1"))
	if _, err := s.Get(KindPod, "edge", "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("Deployment", "edge", "web"); err == nil {
		t.Fatal("Get accepted an unknown kind")
	}
	ok, err := s.Delete(KindPod, "edge", "web")
	if err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	ok, err = s.Delete(KindPod, "edge", "web")
	if err != nil || ok {
		t.Fatalf("second Delete = %v, %v", ok, err)
	}
	if _, err := s.Get(KindPod, "edge", "web"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
	if got := actions(mustApply(t, s, pod("edge", "web", "x:1"))); got != "Pod edge/web created" {
		t.Fatalf("apply after delete: %s", got)
	}
}

func TestCorruptFileIsAnErrorNamingIt(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	content := []byte(strings.Repeat("this is not a bbolt database\n", 1000))
	if err := os.WriteFile(garbage, content, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(garbage)
	if err == nil || !strings.Contains(err.Error(), garbage) {
		t.Fatalf("Open(garbage) = %v, want an error naming %s", err, garbage)
	}
	t.Logf("garbage: %v", err)
	if after, _ := os.ReadFile(garbage); string(after) != string(content) {
		t.Fatal("Open changed the corrupt file")
	}

	// A real store whose data pages are overwritten.
	path := filepath.Join(dir, "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		mustApply(t, s, pod("", fmt.Sprintf("p%d", i), "x:1"))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 4 * 4096; i < len(raw); i++ {
		raw[i] = 0xA5
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(path); err == nil {
		_ = s.Close()
		t.Fatal("Open accepted a store with overwritten pages")
	} else if t.Logf("overwritten pages: %v", err); !strings.Contains(err.Error(), path) {
		t.Fatalf("error does not name the file: %v", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	s, _ := newStore(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if _, err := s.Apply([]runtime.Object{pod("", fmt.Sprintf("w%d-%d", w, i), "x:1")}); err != nil {
					errs <- err
				}
				if _, err := s.ListPods(); err != nil {
					errs <- err
				}
				if _, err := s.NextSeq(); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	pods, _ := s.ListPods()
	if len(pods) != 80 {
		t.Fatalf("%d pods, want 80", len(pods))
	}
	if n, _ := s.NextSeq(); n != 81 {
		t.Fatalf("seq %d, want 81", n)
	}
}

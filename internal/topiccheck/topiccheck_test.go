package topiccheck

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// fakeKafka plays a driver's describe: it answers from answers in turn, repeating the last, and
// counts the questions. A test that sets hold makes each question wait until hold is closed.
type fakeKafka struct {
	mu      sync.Mutex
	answers []error
	asked   int
	hold    chan struct{}
}

func (f *fakeKafka) describe(string) error {
	if f.hold != nil {
		<-f.hold
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.answers[min(f.asked, len(f.answers))-1]
}

func (f *fakeKafka) questions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func (f *fakeKafka) answer(answers ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers = append(f.answers[:0], answers...)
	f.asked = 0
}

var missing = &driver.RejectedError{Err: errors.New(`topic "t" does not exist and was not created`), ByGoharvest: true}

// settled checks the topic until the answer is no longer ErrTopicPending, and returns it.
func settled(t *testing.T, c *Checker, topic string) error {
	t.Helper()
	var err error
	if !testwait.Until(10*time.Second, func() bool {
		err = c.Check(topic)
		return !errors.Is(err, driver.ErrTopicPending)
	}) {
		t.Fatalf("Check(%q) still pending after 10s", topic)
	}
	return err
}

func TestPendingThenUsableAndNeverAskedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeKafka{answers: []error{nil}, hold: make(chan struct{})}
		release := sync.OnceFunc(func() { close(f.hold) })
		c := New(f.describe)
		defer c.Close()
		// Released before Close, which waits for the lookup, should the test fail first.
		defer release()
		c.recheck = time.Millisecond // a usable topic is not asked about again however long it has been
		for range 3 {
			if err := c.Check("t"); !errors.Is(err, driver.ErrTopicPending) {
				t.Fatalf("Check while the lookup waits for Kafka = %v, want ErrTopicPending", err)
			}
		}
		release()
		if err := settled(t, c, "t"); err != nil {
			t.Fatalf("Check of a usable topic = %v, want nil", err)
		}
		advanceTo(time.Now().Add(10 * c.recheck)) // however long it has been
		if err := c.Check("t"); err != nil {
			t.Fatalf("Check of a topic found usable = %v, want nil", err)
		}
		if n := f.questions(); n != 1 {
			t.Errorf("Kafka was asked %d times, want once: a pending and a usable topic are not asked again", n)
		}
	})
}

func TestMissingIsRejectedThenAskedAgainAfterRecheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeKafka{answers: []error{missing}}
		c := New(f.describe)
		defer c.Close()
		c.createWait = 0 // reject at the first answer
		err := settled(t, c, "t")
		var rejected *driver.RejectedError
		if !errors.As(err, &rejected) || err != missing {
			t.Fatalf("Check of a missing topic = %v, want describe's RejectedError", err)
		}
		// On the bubble's clock only settled's polls have passed since the rejection: within recheck.
		if err := c.Check("t"); err != missing {
			t.Fatalf("Check within recheck of the rejection = %v, want the rejection again", err)
		}
		synctest.Wait() // a lookup Check began, if any, has asked
		if asked := f.questions(); asked != 1 {
			t.Fatalf("Kafka was asked %d times within recheck, want once", asked)
		}

		f.answer(nil)                        // the topic has been created since
		advanceTo(time.Now().Add(c.recheck)) // recheck passes
		if err := settled(t, c, "t"); err != nil {
			t.Fatalf("Check after recheck, the topic created = %v, want nil", err)
		}
		if n := f.questions(); n != 1 {
			t.Errorf("Kafka was asked %d times after recheck, want once", n)
		}
	})
}

func TestTopicAppearingWithinTheCreateWaitIsUsable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A broker that creates topics on demand answers "unknown topic" at first.
		f := &fakeKafka{answers: []error{missing, missing, nil}}
		c := New(f.describe)
		defer c.Close()
		if err := settled(t, c, "t"); err != nil {
			t.Fatalf("Check of a topic that appeared within the create wait = %v, want nil", err)
		}
		if n := f.questions(); n != 3 {
			t.Errorf("Kafka was asked %d times, want 3", n)
		}
	})
}

func TestTopicMissingThroughTheCreateWaitIsRejected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeKafka{answers: []error{missing}}
		c := New(f.describe)
		defer c.Close()
		c.createWait = 300 * time.Millisecond
		start := time.Now()
		if err := settled(t, c, "t"); err != missing {
			t.Fatalf("Check of a topic missing throughout = %v, want describe's RejectedError", err)
		}
		if took := time.Since(start); took < 100*time.Millisecond {
			t.Errorf("rejected after %v, before the lookup asked again", took)
		}
		if n := f.questions(); n < 2 {
			t.Errorf("Kafka was asked %d times within the create wait, want at least twice", n)
		}
	})
}

func TestCloseStopsALookup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeKafka{answers: []error{missing}}
		c := New(f.describe)
		c.createWait = time.Hour // the lookup would ask again and again without Close
		if err := c.Check("t"); !errors.Is(err, driver.ErrTopicPending) {
			t.Fatalf("first Check = %v, want ErrTopicPending", err)
		}
		synctest.Wait() // the lookup has asked, and waits to ask again
		if f.questions() == 0 {
			t.Fatal("the lookup never asked Kafka")
		}
		closed := make(chan struct{})
		go func() {
			c.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close still waiting for a lookup after 10s")
		}
		asked := f.questions()
		advanceTo(time.Now().Add(300 * time.Millisecond)) // nothing must ask in this window
		if n := f.questions(); n != asked {
			t.Errorf("Kafka was asked %d times after Close, want none", n-asked)
		}
		c.mu.Lock()
		st := c.topics["t"]
		c.mu.Unlock()
		if st.pending || st.err != missing {
			t.Errorf("after Close the topic's state is %+v; want what was learnt kept, the rejection", st)
		}
	})
}

// advanceTo moves the calling synctest bubble's clock to at, letting the lookups due before it
// run, and returns at.
func advanceTo(at time.Time) time.Time {
	time.Sleep(time.Until(at))
	return at
}

package epoch

import (
	"context"

	"github.com/goharvest/goharvest/outbox"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// A record's publish span is started by its worker when it is first produced and ended by the
// transaction loop when its transaction commits or the epoch gives it up; the span is the
// flight's, so it has the flight's owner (see flight).

// headerCarrier lets OpenTelemetry read a record's headers.
type headerCarrier outbox.Headers

func (c headerCarrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return h.Value
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// startSpan begins the record's publish span, once, linked to the trace in its traceparent
// header (the request that wrote it), when tracing is on.
func (p *Epoch) startSpan(f *flight) {
	if p.Tracer == nil || f.span != nil {
		return
	}
	written := propagation.TraceContext{}.Extract(context.Background(), headerCarrier(f.rec.KafkaHeaders))
	_, f.span = p.Tracer.Start(context.Background(), "publish "+f.rec.KafkaTopic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithLinks(trace.LinkFromContext(written)),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", f.rec.KafkaTopic),
			attribute.Int64("goharvest.record.id", f.rec.ID),
			attribute.String("goharvest.leader.id", p.LeaderID.String()),
		))
}

// endSpan ends the record's publish span, if any: committed (err nil) or given up in this epoch.
func (p *Epoch) endSpan(f *flight, err error) {
	if f.span == nil {
		return
	}
	if err != nil {
		f.span.RecordError(err)
		f.span.SetStatus(codes.Error, err.Error())
	}
	f.span.End()
	f.span = nil
}

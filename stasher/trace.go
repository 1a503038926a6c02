package stasher

import (
	"context"

	"go.opentelemetry.io/otel/propagation"

	"github.com/goharvest/goharvest/outbox"
)

// TraceHeaders returns the W3C trace context of ctx (a traceparent header, and tracestate when
// there is one) to add to a record's headers, so that the published message carries the trace
// of the request that wrote it. The harvester publishes headers unchanged. It returns no headers
// when ctx carries no span.
func TraceHeaders(ctx context.Context) outbox.Headers {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	var headers outbox.Headers
	for _, key := range []string{"traceparent", "tracestate"} {
		if v := carrier.Get(key); v != "" {
			headers = append(headers, outbox.Header{Key: key, Value: v})
		}
	}
	return headers
}

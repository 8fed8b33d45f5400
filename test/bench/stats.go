package main

import (
	"math"
	"slices"
	"time"
)

// latencies summarises a set of durations in milliseconds.
type latencies struct {
	N      int     `json:"n"`
	MinMs  float64 `json:"minMs"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	MeanMs float64 `json:"meanMs"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// summarise computes nearest-rank percentiles (p99 of 20 samples is the max).
func summarise(ds []time.Duration) latencies {
	if len(ds) == 0 {
		return latencies{}
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	var total time.Duration
	for _, d := range sorted {
		total += d
	}
	return latencies{
		N:      len(sorted),
		MinMs:  ms(sorted[0]),
		P50Ms:  ms(percentile(sorted, 0.50)),
		P99Ms:  ms(percentile(sorted, 0.99)),
		MaxMs:  ms(sorted[len(sorted)-1]),
		MeanMs: ms(total / time.Duration(len(sorted))),
	}
}

// percentile is the nearest-rank percentile q (0<q<=1) of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// The backend half of what Grafana's ClickHouse datasource does to a panel's SQL before it
// reaches clickhouse-go: its macro expansion, ported.
//
// The plugin (github.com/grafana/clickhouse-datasource v4.20.0, the release that pins
// clickhouse-go v2.47.0) expands macros in pkg/macros/macros.go, Interpolate: first its
// statement macros ($__columns, $__rateColumns, $__perSecondColumns, $__increaseColumns,
// $__lttb; not ported, the dashboard uses none), then github.com/grafana/macropro v1.0.1
// (parser.go Interpolate, macropro.go StripComments, defaults.go DefaultMacros) with the map
// macros.ClickHouseMacros and the comment style LineComment | BlockComment | BackslashEscape |
// BacktickQuote | DollarQuote. sqlds v5.3.0 (datasource.go handleQuery) calls it through the
// plugin's Interpolator with the query's TimeRange and Interval (backend.DataQuery.Interval:
// the panel's intervalMs) and sends the result to the driver unchanged.
//
// Neither module is on the Go module proxy that this project can reach (403 for
// grafana/clickhouse-datasource, grafana/macropro and grafana/sqlds), so this file is a port
// of those rules, written for this harness:
//
//   - comments (-- to the end of the line, /* */ or to the end of the text) become spaces,
//     outside '...' and "..." literals (doubled quote and backslash escapes), `...`
//     identifiers and $tag$...$tag$ literals;
//   - the macro names are tried longest first ($__timeFilter_ms before $__timeFilter), each
//     over the whole text; a match followed by a name character [A-Za-z0-9_] is not one;
//   - "(" right after the name opens the argument list, closed at depth 0 outside literals
//     (unbalanced: no argument list); the arguments split at depth-0 commas, trimmed; "()"
//     is no argument;
//   - unknown $__ names stay as they are; a handler's error leaves the query unexpanded and
//     returns the error.
package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// GrafanaQuery is what the plugin's handlers read from sqlutil.Query.
type GrafanaQuery struct {
	From       time.Time
	To         time.Time
	IntervalMS int64
	Table      string
	Column     string
}

func (q GrafanaQuery) interval() time.Duration { return time.Duration(q.IntervalMS) * time.Millisecond }

type macroFunc func(q GrafanaQuery, args []string) (string, error)

func argCount(name string, want int, args []string) error {
	if len(args) != want {
		return fmt.Errorf("%s expected %d argument(s), received %d", name, want, len(args))
	}
	return nil
}

func chDate(t time.Time) string     { return "toDate('" + t.Format("2006-01-02") + "')" }
func chDateTime(t time.Time) string { return "toDateTime(" + strconv.FormatInt(t.Unix(), 10) + ")" }
func chDateTime64(t time.Time) string {
	return "fromUnixTimestamp64Milli(" + strconv.FormatInt(t.UnixMilli(), 10) + ")"
}

// between: "col >= lo AND col <= hi", the shape of every range filter the plugin writes.
func between(col, lo, hi string) string { return col + " >= " + lo + " AND " + col + " <= " + hi }

func oneColumn(name string, render func(q GrafanaQuery, col string) string) macroFunc {
	return func(q GrafanaQuery, args []string) (string, error) {
		if err := argCount(name, 1, args); err != nil {
			return "", err
		}
		return render(q, args[0]), nil
	}
}

func constant(render func(q GrafanaQuery) string) macroFunc {
	return func(q GrafanaQuery, _ []string) (string, error) { return render(q), nil }
}

// compactDuration: macropro.FormatDuration (the largest whole unit: 1h, 5m, 30s, 250ms).
func compactDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
}

func timeGroup(q GrafanaQuery, args []string) (string, error) {
	if err := argCount("$__timeGroup", 2, args); err != nil {
		return "", err
	}
	period := strings.Trim(strings.TrimSpace(args[1]), "'\"")
	d, err := time.ParseDuration(period)
	if err != nil {
		return "", fmt.Errorf("$__timeGroup: invalid interval %q: %w", period, err)
	}
	secs := int64(math.Round(d.Seconds()))
	if secs <= 0 {
		return "", fmt.Errorf("$__timeGroup: interval must be positive, got %q", period)
	}
	return fmt.Sprintf("toStartOfInterval(toDateTime(%s), INTERVAL %d second)",
		strings.TrimSpace(args[0]), secs), nil
}

// clickHouseMacros: macropro.DefaultMacros merged with the plugin's ClickHouseMacros (the
// plugin's entries win: timeFilter, timeFrom, timeTo, timeGroup).
var clickHouseMacros = map[string]macroFunc{
	// macropro defaults the plugin keeps
	"interval":    constant(func(q GrafanaQuery) string { return compactDuration(q.interval()) }),
	"interval_ms": constant(func(q GrafanaQuery) string { return strconv.FormatInt(q.IntervalMS, 10) }),
	"table": func(q GrafanaQuery, _ []string) (string, error) {
		if q.Table == "" {
			return "", fmt.Errorf("$__table: no table name in query context")
		}
		return q.Table, nil
	},
	"column": func(q GrafanaQuery, _ []string) (string, error) {
		if q.Column == "" {
			return "", fmt.Errorf("$__column: no column name in query context")
		}
		return q.Column, nil
	},
	// the plugin's
	"timeFilter": oneColumn("$__timeFilter", func(q GrafanaQuery, c string) string {
		return between(c, chDateTime(q.From), chDateTime(q.To))
	}),
	"timeFrom": oneColumn("$__timeFrom", func(q GrafanaQuery, c string) string {
		return c + " >= " + chDateTime(q.From)
	}),
	"timeTo": oneColumn("$__timeTo", func(q GrafanaQuery, c string) string {
		return c + " <= " + chDateTime(q.To)
	}),
	"timeGroup":   timeGroup,
	"fromTime":    constant(func(q GrafanaQuery) string { return chDateTime(q.From) }),
	"toTime":      constant(func(q GrafanaQuery) string { return chDateTime(q.To) }),
	"fromTime_ms": constant(func(q GrafanaQuery) string { return chDateTime64(q.From) }),
	"toTime_ms":   constant(func(q GrafanaQuery) string { return chDateTime64(q.To) }),
	"timeFilter_ms": oneColumn("$__timeFilter_ms", func(q GrafanaQuery, c string) string {
		return between(c, chDateTime64(q.From), chDateTime64(q.To))
	}),
	"dateFilter": oneColumn("$__dateFilter", func(q GrafanaQuery, c string) string {
		return between(c, chDate(q.From), chDate(q.To))
	}),
	"dateTimeFilter": dateTimeFilter("$__dateTimeFilter"),
	"dt":             dateTimeFilter("$__dt"),
	"timeInterval": oneColumn("$__timeInterval", func(q GrafanaQuery, c string) string {
		return fmt.Sprintf("toStartOfInterval(toDateTime(%s), INTERVAL %d second)", c,
			int(math.Max(q.interval().Seconds(), 1)))
	}),
	"timeInterval_ms": oneColumn("$__timeInterval_ms", func(q GrafanaQuery, c string) string {
		return fmt.Sprintf("toStartOfInterval(toDateTime64(%s, 3), INTERVAL %d millisecond)", c,
			int(math.Max(float64(q.IntervalMS), 1)))
	}),
	"interval_s": constant(func(q GrafanaQuery) string {
		return strconv.Itoa(int(math.Max(q.interval().Seconds(), 1)))
	}),
}

func dateTimeFilter(name string) macroFunc {
	return func(q GrafanaQuery, args []string) (string, error) {
		if err := argCount(name, 2, args); err != nil {
			return "", err
		}
		return "(" + between(args[0], chDate(q.From), chDate(q.To)) + ") AND (" +
			between(args[1], chDateTime(q.From), chDateTime(q.To)) + ")", nil
	}
}

// --- the engine (macropro with the plugin's comment style) ------------------------------

// skipQuoted returns the index just past the quoted region that starts at s[i] ('"` or a
// dollar tag), or i when none starts there.
func skipQuoted(s string, i int) int {
	switch c := s[i]; c {
	case '\'', '"', '`':
		j := i + 1
		for j < len(s) {
			switch {
			case s[j] == '\\' && c != '`':
				j += 2
			case s[j] == c && j+1 < len(s) && s[j+1] == c:
				j += 2
			case s[j] == c:
				return j + 1
			default:
				j++
			}
		}
		return len(s)
	case '$':
		j := i + 1
		for j < len(s) && isNameChar(s[j]) {
			j++
		}
		if j >= len(s) || s[j] != '$' {
			return i
		}
		tag := s[i : j+1]
		if k := strings.Index(s[j+1:], tag); k >= 0 {
			return j + 1 + k + len(tag)
		}
	}
	return i
}

func isNameChar(b byte) bool {
	return b == '_' || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9')
}

func stripComments(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if j := skipQuoted(s, i); j > i {
			b.WriteString(s[i:j])
			i = j
			continue
		}
		j := i
		if strings.HasPrefix(s[i:], "--") {
			for j < len(s) && s[j] != '\n' && s[j] != '\r' {
				j++
			}
		} else if strings.HasPrefix(s[i:], "/*") {
			if k := strings.Index(s[i+2:], "*/"); k >= 0 {
				j = i + 2 + k + 2
			} else {
				j = len(s)
			}
		}
		if j > i {
			b.WriteString(strings.Repeat(" ", j-i))
			i = j
			continue
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}

// closingParen: the index of the ")" closing the "(" at s[0], or -1.
func closingParen(s string) int {
	depth := 0
	for i := 0; i < len(s); {
		if j := skipQuoted(s, i); j > i {
			i = j
			continue
		}
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return -1
}

func splitArgs(raw string) ([]string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return []string{}, nil
	}
	var args []string
	depth, start := 0, 0
	for i := 0; i < len(raw); {
		if j := skipQuoted(raw, i); j > i {
			i = j
			continue
		}
		switch raw[i] {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return nil, fmt.Errorf("unexpected ')' at position %d", i)
			}
			depth--
		case ',':
			if depth == 0 {
				args = append(args, strings.TrimSpace(raw[start:i]))
				start = i + 1
			}
		}
		i++
	}
	if depth != 0 {
		return nil, fmt.Errorf("unbalanced parentheses in arguments")
	}
	return append(args, strings.TrimSpace(raw[start:])), nil
}

// Expand: the SQL that the plugin hands to clickhouse-go for rawSQL (after the frontend has
// replaced the template variables).
func Expand(rawSQL string, q GrafanaQuery) (string, error) {
	text := stripComments(rawSQL)
	names := make([]string, 0, len(clickHouseMacros))
	for name := range clickHouseMacros {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if len(names[i]) != len(names[j]) {
			return len(names[i]) > len(names[j])
		}
		return names[i] < names[j]
	})
	for _, name := range names {
		token := "$__" + name
		var out strings.Builder
		rest := text
		for {
			at := strings.Index(rest, token)
			if at < 0 {
				out.WriteString(rest)
				break
			}
			end := at + len(token)
			if end < len(rest) && isNameChar(rest[end]) { // a longer name
				out.WriteString(rest[:end])
				rest = rest[end:]
				continue
			}
			out.WriteString(rest[:at])
			rest = rest[end:]
			raw := ""
			if strings.HasPrefix(rest, "(") {
				if close := closingParen(rest); close >= 0 {
					raw, rest = rest[1:close], rest[close+1:]
				}
			}
			args, err := splitArgs(raw)
			if err != nil {
				return rawSQL, fmt.Errorf("macro %s: %w", token, err)
			}
			repl, err := clickHouseMacros[name](q, args)
			if err != nil {
				return rawSQL, fmt.Errorf("macro %s(%s): %w", token, strings.Join(args, ", "), err)
			}
			out.WriteString(repl)
		}
		text = out.String()
	}
	return text, nil
}

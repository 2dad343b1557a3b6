// bicheck drives a ClickHouse HTTP endpoint with clickhouse-go v2 opened the way Grafana's
// ClickHouse datasource (pkg/plugin/driver.go, buildClickHouseOptions) opens it, and reports
// what each step returned as JSON, so that pytest can assert on it.
//
// stdin:  {"addr": "127.0.0.1:8123", "user": "...", "password": "...", "database": "",
//
//	"compression": "gzip"|"lz4", "steps": [step, ...]}
//
// step:   {"op": "ping"|"query"|"exec"|"batch"|"expand", "sql": "...", "args": [arg, ...],
//
//	"params": {"name": "value"}, "settings": {"name": "value"},
//	"types": ["string", ...], "rows": [[...], ...],   (types/rows: batch only)
//	"grafana": {"from": RFC 3339, "to": RFC 3339, "interval_ms": N},
//	"repeat": N}
//
// grafana: expand the SQL's $__ macros as the ClickHouse datasource plugin does for a panel
// over that time range and interval (macros.go) before running it; "expand" only expands.
// repeat: run the query N times (default 1), each timed in elapsed_ms (from the call to
// QueryContext to the last row scanned: what the plugin waits for), the last one's rows kept.
//
// arg:    {"kind": "string"|"int"|"uint"|"float"|"time"|"strings"|"null", "v": ..., "name": ""}
//
//	a non-empty name binds it as clickhouse.Named (@name in the SQL)
//
// stdout: [{"op", "sql", "expanded", "error", "columns", "types", "scan_types", "rows",
//
//	"rows_affected", "elapsed_ms"}]
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

type Arg struct {
	Kind string          `json:"kind"`
	V    json.RawMessage `json:"v"`
	Name string          `json:"name"`
}

type Step struct {
	Op       string              `json:"op"`
	SQL      string              `json:"sql"`
	Args     []Arg               `json:"args"`
	Params   map[string]string   `json:"params"`
	Settings map[string]string   `json:"settings"`
	Types    []string            `json:"types"`
	Rows     [][]json.RawMessage `json:"rows"`
	Grafana  *GrafanaRange       `json:"grafana"`
	Repeat   int                 `json:"repeat"`
}

type GrafanaRange struct {
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	IntervalMS int64     `json:"interval_ms"`
}

type Script struct {
	Addr        string `json:"addr"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Database    string `json:"database"`
	Compression string `json:"compression"`
	Steps       []Step `json:"steps"`
}

type Result struct {
	Op           string      `json:"op"`
	SQL          string      `json:"sql"`
	Expanded     string      `json:"expanded"`
	Error        string      `json:"error"`
	Columns      []string    `json:"columns"`
	Types        []string    `json:"types"`
	ScanTypes    []string    `json:"scan_types"`
	Rows         [][]*string `json:"rows"`
	RowsAffected int64       `json:"rows_affected"`
	ElapsedMS    []float64   `json:"elapsed_ms"`
}

// options mirrors buildClickHouseOptions for a plain (no TLS, no JWT, no custom settings)
// datasource over HTTP: the plugin's defaults are dialTimeout "10" and queryTimeout "60".
func options(s Script) *clickhouse.Options {
	method := clickhouse.CompressionGZIP // what the plugin picks for Protocol HTTP
	if s.Compression == "lz4" {
		method = clickhouse.CompressionLZ4 // what it picks for Native; also valid over HTTP
	}
	return &clickhouse.Options{
		Addr: []string{s.Addr},
		Auth: clickhouse.Auth{Database: s.Database, Username: s.User, Password: s.Password},
		ClientInfo: clickhouse.ClientInfo{Products: []struct{ Name, Version string }{
			{Name: "grafana", Version: "12.1.0"},
			{Name: "clickhouse-datasource", Version: "4.11.0"},
		}},
		Compression: &clickhouse.Compression{Method: method},
		DialTimeout: 10 * time.Second,
		HttpHeaders: map[string]string{},
		HttpUrlPath: "",
		Protocol:    clickhouse.HTTP,
		ReadTimeout: 60 * time.Second,
		Settings:    clickhouse.Settings{},
	}
}

func value(kind string, raw json.RawMessage) (any, error) {
	var s string
	if kind != "strings" && kind != "null" {
		if err := json.Unmarshal(raw, &s); err != nil {
			// numbers may come unquoted
			s = string(raw)
		}
	}
	switch kind {
	case "string":
		return s, nil
	case "int":
		return strconv.ParseInt(s, 10, 64)
	case "uint":
		return strconv.ParseUint(s, 10, 64)
	case "float":
		return strconv.ParseFloat(s, 64)
	case "time":
		return time.Parse(time.RFC3339Nano, s)
	case "strings":
		var out []string
		err := json.Unmarshal(raw, &out)
		return out, err
	case "null":
		return nil, nil
	}
	return nil, fmt.Errorf("unknown arg kind %q", kind)
}

func args(in []Arg) ([]any, error) {
	out := make([]any, 0, len(in))
	for _, a := range in {
		v, err := value(a.Kind, a.V)
		if err != nil {
			return nil, err
		}
		if a.Name != "" {
			out = append(out, clickhouse.Named(a.Name, v))
		} else {
			out = append(out, v)
		}
	}
	return out, nil
}

func context_(st Step) context.Context {
	ctx := context.Background()
	if len(st.Params) > 0 {
		ctx = clickhouse.Context(ctx, clickhouse.WithParameters(clickhouse.Parameters(st.Params)))
	}
	if len(st.Settings) > 0 {
		set := clickhouse.Settings{}
		for k, v := range st.Settings {
			set[k] = v
		}
		ctx = clickhouse.Context(ctx, clickhouse.WithSettings(set))
	}
	return ctx
}

func format(v reflect.Value) *string {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	var s string
	switch x := v.Interface().(type) {
	case time.Time:
		s = x.UTC().Format(time.RFC3339Nano)
	case []byte:
		s = string(x)
	default:
		if v.Kind() == reflect.Slice || v.Kind() == reflect.Map || v.Kind() == reflect.Array {
			b, err := json.Marshal(v.Interface())
			if err != nil {
				s = fmt.Sprint(x)
			} else {
				s = string(b)
			}
		} else {
			s = fmt.Sprint(x)
		}
	}
	return &s
}

func query(db *sql.DB, st Step, r *Result) error {
	n := st.Repeat
	if n < 1 {
		n = 1
	}
	for i := 0; i < n; i++ {
		*r = Result{Op: r.Op, SQL: r.SQL, Expanded: r.Expanded, ElapsedMS: r.ElapsedMS}
		start := time.Now()
		if err := query1(db, st, r); err != nil {
			return err
		}
		r.ElapsedMS = append(r.ElapsedMS, float64(time.Since(start).Microseconds())/1000)
	}
	return nil
}

func query1(db *sql.DB, st Step, r *Result) error {
	a, err := args(st.Args)
	if err != nil {
		return err
	}
	rows, err := db.QueryContext(context_(st), st.SQL, a...)
	if err != nil {
		return err
	}
	defer rows.Close()
	cts, err := rows.ColumnTypes()
	if err != nil {
		return err
	}
	for _, ct := range cts {
		r.Columns = append(r.Columns, ct.Name())
		r.Types = append(r.Types, ct.DatabaseTypeName())
		r.ScanTypes = append(r.ScanTypes, ct.ScanType().String())
	}
	r.Rows = [][]*string{}
	for rows.Next() {
		dest := make([]any, len(cts))
		for i, ct := range cts {
			dest[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		row := make([]*string, len(cts))
		for i := range dest {
			row[i] = format(reflect.ValueOf(dest[i]))
		}
		r.Rows = append(r.Rows, row)
	}
	return rows.Err()
}

func exec(db *sql.DB, st Step, r *Result) error {
	a, err := args(st.Args)
	if err != nil {
		return err
	}
	res, err := db.ExecContext(context_(st), st.SQL, a...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err == nil {
		r.RowsAffected = n
	}
	return nil
}

// batch uses the native API (clickhouse.Open) over the same options: PrepareBatch, Append, Send.
func batch(s Script, st Step, r *Result) error {
	conn, err := clickhouse.Open(options(s))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx := context_(st)
	b, err := conn.PrepareBatch(ctx, st.SQL)
	if err != nil {
		return err
	}
	for _, row := range st.Rows {
		vals := make([]any, len(row))
		for i, raw := range row {
			if vals[i], err = value(st.Types[i], raw); err != nil {
				return err
			}
		}
		if err := b.Append(vals...); err != nil {
			return err
		}
	}
	if err := b.Send(); err != nil {
		return err
	}
	r.RowsAffected = int64(len(st.Rows))
	return nil
}

func main() {
	var s Script
	if err := json.NewDecoder(os.Stdin).Decode(&s); err != nil {
		fmt.Fprintln(os.Stderr, "bad script:", err)
		os.Exit(2)
	}
	db := clickhouse.OpenDB(options(s))
	defer db.Close()
	// the plugin sets these from its settings; its defaults
	db.SetConnMaxLifetime(5 * time.Minute)
	db.SetMaxIdleConns(25)
	db.SetMaxOpenConns(50)
	out := make([]Result, 0, len(s.Steps))
	for _, st := range s.Steps {
		r := Result{Op: st.Op, SQL: st.SQL}
		var err error
		if st.Grafana != nil {
			r.Expanded, err = Expand(st.SQL, GrafanaQuery{
				From: st.Grafana.From, To: st.Grafana.To, IntervalMS: st.Grafana.IntervalMS,
			})
			st.SQL = r.Expanded
		}
		switch {
		case err != nil:
		case st.Op == "expand":
		default:
			err = run(db, s, st, &r)
		}
		if err != nil {
			r.Error = err.Error()
		}
		out = append(out, r)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		os.Exit(3)
	}
}

func run(db *sql.DB, s Script, st Step, r *Result) error {
	var err error
	switch st.Op {
	case "ping":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = db.PingContext(ctx)
		cancel()
	case "query":
		err = query(db, st, r)
	case "exec":
		err = exec(db, st, r)
	case "batch":
		err = batch(s, st, r)
	default:
		err = fmt.Errorf("unknown op %q", st.Op)
	}
	return err
}

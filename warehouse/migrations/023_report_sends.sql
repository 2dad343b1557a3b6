-- Who sent which report (gpugap monthly-report; docs/commands.md#gpugap-monthly-report). Append-only
-- (a plain MergeTree: nothing replaces or collapses a row): one row per mail the SMTP server
-- took, written after it did. sent_by: --sent-by, else the OS user the command ran as; kind:
-- 'team' or 'user'; subject_of: that team or user; period: the month, YYYY-MM; recipient: the
-- envelope address; message_id: the mail's, fixed per subject and month (a resend has the same).
CREATE TABLE IF NOT EXISTS report_sends
(
    sent_at DateTime64(3, 'UTC'),
    sent_by String,
    kind LowCardinality(String),
    subject_of String,
    period String,
    recipient String,
    message_id String
)
ENGINE = MergeTree
ORDER BY (period, kind, subject_of, sent_at);

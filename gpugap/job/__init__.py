"""``gpugap job ID``: one allocation's report for the person who ran it (figures, idle
stretches, padding, queue wait and advice), for the command and the page's ``/job``. Its own
package above the report, the recommenders and the queue report, whose rules it applies."""

//! The sections clap cannot derive (ENVIRONMENT, EXIT STATUS, FILES, SEE ALSO), in roff, per
//! page. Facts are the code's: each names where it is defined, so a change there can be
//! followed here.

/// What ranks started by greedyrun find in their environment (launcher/src/agent.rs and the
/// servers' `env_for`/`socketpair_for` in pmix-shim).
const RANK_ENV: &str = r#".SS "What every rank receives"
greedyrun's own environment (less HOSTNAME, PWD, OLDPWD, SHLVL, _, SSH_CLIENT,
SSH_CONNECTION, SSH_TTY, SSH_AUTH_SOCK, DISPLAY and XAUTHORITY), its working directory, and:
.TP
.B GREEDY_JOB
the job id, also the PMI kvsname.
.TP
.BR GREEDY_RANK ", " GREEDY_SIZE
this rank and the number of ranks.
.TP
.B GREEDY_NODE
the index of this rank's host in the host list (0 is the first host).
.TP
.B GREEDY_HOST
the name of this rank's host, as the host list gives it.
.TP
.BR GREEDY_LOCAL_RANK ", " GREEDY_LOCAL_SIZE
this rank's index among the ranks of its host, and their number.
.TP
.B GREEDY_CPUS
with \fB\-\-bind\-to core\fR or \fBsocket\fR: the CPUs the rank is bound to, comma-separated.
.TP
.B GREEDY_TASK
with \fB\-\-tasks\fR: the task's line number in the stream (from 1); a task gets
\fBGREEDY_JOB\fR and \fBGREEDY_NODE\fR too, no rank variables and no wire\-up.
.TP
.B GREEDY_STAGED
with \fB\-\-tasks\fR, for a task that lists \fBinputs\fR: the directory on its host where
it finds them by their file names (removed when it ends).
.PP
An outer launcher's endpoints in greedyrun's environment (\fBPMI_*\fR but \fBPMI_DEBUG\fR,
\fBPMIX_*\fR but \fBPMIX_MCA_*\fR, \fBNETSTART\fR, ...) are not passed on. Then, by
\fB\-\-pmi\fR:
.TP
.B auto
everything that \fBpmi1\fR, \fBpmix\fR and \fBcharm\fR give below, each rank served by the
protocol it speaks, and \fBMPIR_CVAR_PMI_VERSION\fR=1 unless the rank's environment has it
(MPICH 4.1 and later refuse to choose between PMI and PMIx variables by itself).
.TP
.BR pmi1 ", " pmi2
.BR PMI_FD " (3: the rank's end of a socketpair to its host agent; nothing listens), "
.BR PMI_RANK ", " PMI_SIZE ", " PMI_JOBID ", " MPI_LOCALNRANKS ", " MPI_LOCALRANKID ;
nothing else.
.TP
.B pmix
what PMIx_server_setup_fork gives (\fBPMIX_NAMESPACE\fR, \fBPMIX_RANK\fR,
\fBPMIX_SERVER_URI*\fR, \fBPMIX_SERVER_TMPDIR\fR, \fBPMIX_SECURITY_MODE\fR, ...), and an empty
\fBFLUX_JOB_ID\fR (Open MPI 4.1 accepts a direct launch only under a resource manager it
knows); nothing else.
.TP
.B charm
.B NETSTART
("rank 127.0.0.1 port pid 0": the agent admits only its own descendants) and
.BR NETMAGIC ,
as charmrun would give a netlrts Charm++ program.
.TP
.B none
nothing more.
"#;

/// greedyrun(1).
const GREEDYRUN: &str = r#".SH ENVIRONMENT
.TP
.B GREEDY_RSH
default of \fB\-\-rsh\fR.
.TP
.BR GREEDY_SEQ ", " GREEDY_REM
defaults of \fB\-\-seq\fR and \fB\-\-rem\fR; \fBgreedyrun \-\-calibrate\fR prints the
lines to set them.
.TP
.B GREEDY_SESSION
the control socket of a running session (\fBeval $(greedyrun \-\-start\-session ...)\fR sets
it): \fB\-\-tasks\fR, \fB\-\-status\fR and \fB\-\-end\-session\fR use that session's hosts.
.TP
.B GREEDY_AGENT
default of \fB\-\-agent\fR (greedyd beside this greedyrun). The value is split at blanks, so
\fBGREEDY_AGENT="env GREEDY_LOG=debug /usr/bin/greedyd"\fR turns on the agents' logs.
"#;

/// greedyrun(1), after the environment.
const GREEDYRUN_EXIT: &str = r#".SH "EXIT STATUS"
.TP
.B 0
every rank exited 0.
.TP
.I N
the first rank to fail exited with \fIN\fR: 128+\fIS\fR when it was killed by signal \fIS\fR,
127 when it could not be started. A failing rank ends the job unless \fB\-\-keep\-going\fR.
.TP
.B 2
the command line or the hostfile was refused; nothing was started.
.TP
.B 124
some agent did not start within \fB\-\-timeout\fR (the message names the hosts).
.TP
.B 125
a host could not be reached, an agent or its remote shell died, or the wire\-up failed (the
message names the host or rank).
.TP
.BR 130 ", " 129 ", " 143
greedyrun got SIGINT (Ctrl\-C), SIGHUP or SIGTERM; every rank got SIGTERM, then SIGKILL after
\fB\-\-grace\fR.
.TP
.B 141
greedyrun's standard output was closed (broken pipe); the job was ended quietly.
.PP
With \fB\-\-tasks\fR: 0 when every task ended 0; 1 when some task failed after its retries
(each is named); 2 when the stream or \fB\-\-results\fR could not be opened; 125 when no host
was left to run the rest (each task not run is named); 129, 130 or 143 when interrupted; 141
when its standard output was closed.
.SH NOTES
greedyd must be at the same path on every host (the package installs it as
/usr/bin/greedyd). One remote shell per host is started, along the greedy launch tree; each
host's greedyd starts its own subtree.
.SH "SEE ALSO"
.BR greedyd (8),
.BR greedy\-tree (1),
.BR greedy (7),
.BR mpi_greedy (8),
.BR ssh (1)
"#;

/// greedyd(8).
const GREEDYD: &str = r#".SH ENVIRONMENT
.TP
.B GREEDY_LOG
the agent's log filter, in RUST_LOG syntax (e.g. \fBdebug\fR or
\fBgreedy_launcher=debug\fR); default \fBerror\fR. Logs go to stderr, which greedyrun prints
as notes. greedyd reads its own environment, the one the remote shell gives it: use
\fBgreedyrun \-\-agent "env GREEDY_LOG=debug /usr/bin/greedyd"\fR.
.SH FILES
.TP
.B greedy\-guard
beside greedyd (\fB/usr/bin/greedy\-guard\fR): the small process each greedyd starts to end
its ranks if greedyd itself is killed; without it greedyd runs a copy of itself instead.
.SH "EXIT STATUS"
greedyd reports ranks' ends to greedyrun over its standard output; its own status only
tells the remote shell whether its part ended normally (0) or not. It is 1 when it could not
take its job: no job description on stdin, or greedyrun speaks another protocol version
(install the same greedy version on every host).
.SH "SEE ALSO"
.BR greedyrun (1),
.BR greedy (7)
"#;

/// greedy-tree(1) and its subcommand pages.
const GREEDY_TREE: &str = r#".SH "EXIT STATUS"
.TP
.B 0
success (also for \-\-help and \-\-version, and when the reader of the output went away).
.TP
.B 1
a file could not be read or the output not written.
.TP
.B 2
bad input: a bad number, an unknown topology, an empty or malformed host list, hostfile or
measurements file (the message names the parameter, the hostlist column or the line and
column).
.SH "SEE ALSO"
.BR greedy\-tree (1),
.BR greedy\-tree\-plan (1),
.BR greedy\-tree\-compare (1),
.BR greedy\-tree\-calibrate (1),
.BR greedyrun (1),
.BR greedy (7)
"#;

/// The extra sections of the page `name`.
pub(crate) fn sections(name: &str) -> String {
    match name {
        "greedyrun" => format!("{GREEDYRUN}{RANK_ENV}{GREEDYRUN_EXIT}"),
        "greedyd" => GREEDYD.to_string(),
        n if n.starts_with("greedy-tree") => GREEDY_TREE.to_string(),
        _ => String::new(),
    }
}

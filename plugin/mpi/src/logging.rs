//! tracing → the Slurm process's own log: greedy-pmix's events (with their job/node/rank
//! spans) land in slurmd's log file for slurmstepd, and on stderr for srun.

use std::io::Write;
use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;

/// Where a finished line goes: Slurm's logger at the matching level.
pub type Sink = fn(Level, &str);

/// One event's bytes, handed to the sink whole when the formatter drops the writer.
pub struct LineWriter {
    level: Level,
    buf: Vec<u8>,
    sink: Sink,
}

impl Write for LineWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        let text = text.trim_end();
        if !text.is_empty() {
            (self.sink)(self.level, text);
        }
    }
}

/// Makes a [`LineWriter`] per event.
#[derive(Clone, Copy)]
pub struct MakeLine(pub Sink);

impl<'a> MakeWriter<'a> for MakeLine {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            level: Level::INFO,
            buf: Vec::new(),
            sink: self.0,
        }
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> LineWriter {
        LineWriter {
            level: *meta.level(),
            buf: Vec::new(),
            sink: self.0,
        }
    }
}

/// Installs the bridge as the process-wide subscriber, once; later calls and a process that
/// already has one are left alone.
pub fn install(sink: Sink) {
    let _ = tracing_subscriber::fmt()
        .with_writer(MakeLine(sink))
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .with_max_level(Level::INFO)
        .try_init();
}

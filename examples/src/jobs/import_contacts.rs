//! A contact-list import: the CSV travels in the job, often megabytes, so producers send it as a large
//! payload (S3 pointer) and the handler receives the whole text as any other job.

use std::sync::Arc;

use conveyor_core::{Context, Handler, HandlerError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::outbox::Outbox;

/// The job: a list and its CSV (a header line with an `email` column, then one contact per line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContactImport {
    /// The list the contacts go to.
    pub list_id: String,
    /// The CSV text.
    pub csv: String,
}

/// What was imported.
#[derive(Debug, Serialize, Deserialize)]
pub struct Imported {
    /// Contacts imported.
    pub rows: usize,
}

/// Imports contact lists.
#[derive(Debug)]
pub struct ImportContacts {
    /// Where imports are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for ImportContacts {
    type Job = ContactImport;
    type Output = Imported;
    const JOB_TYPE: &'static str = "import_contacts";

    async fn handle(&self, job: ContactImport, ctx: Context) -> Result<Imported, HandlerError> {
        let mut lines = job.csv.lines();
        let header = lines.next().unwrap_or_default();
        if !header.split(',').any(|column| column.trim() == "email") {
            // The file will not change: retrying cannot help.
            return Err(HandlerError::permanent(format!(
                "contact list {}: the CSV has no email column (header {header:?})",
                job.list_id
            )));
        }
        let rows = lines.filter(|line| !line.trim().is_empty()).count();
        self.outbox
            .record(&serde_json::json!({
                "effect": "contacts_imported",
                "list_id": job.list_id,
                "rows": rows,
                "csv_bytes": job.csv.len(),
                "csv_sha256": hex::encode(Sha256::digest(job.csv.as_bytes())),
                "message_id": ctx.message_id(),
            }))
            .await?;
        Ok(Imported { rows })
    }
}

//! Flight data with `app_metadata` on every batch (arrow-flight's encoder puts it only on the
//! schema message).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow::error::ArrowError;
use arrow::ipc::writer::{
    CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
};
use arrow_flight::decode::DecodedFlightData;
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, FlightDescriptor};
use bytes::Bytes;

/// Encodes one Flight stream: a schema message, then batches (dictionaries are sent before
/// the batch that uses them, and again when they change).
pub struct BatchEncoder {
    generator: IpcDataGenerator,
    dictionaries: DictionaryTracker,
    compression: CompressionContext,
    options: IpcWriteOptions,
}

impl std::fmt::Debug for BatchEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchEncoder")
    }
}

impl Default for BatchEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchEncoder {
    pub fn new() -> Self {
        BatchEncoder {
            generator: IpcDataGenerator::default(),
            dictionaries: DictionaryTracker::new(false),
            compression: CompressionContext::default(),
            options: IpcWriteOptions::default(),
        }
    }

    /// An encoder whose batches' buffers are compressed with ZSTD (what a log table with the
    /// default compression stores, so its leader stores them as they arrive).
    pub fn zstd() -> Self {
        let mut encoder = Self::new();
        if let Ok(options) =
            IpcWriteOptions::default().try_with_compression(Some(arrow::ipc::CompressionType::ZSTD))
        {
            encoder.options = options;
        }
        encoder
    }

    /// The stream's first message, with the descriptor a `DoPut` needs. It assigns the
    /// dictionary ids the batches' dictionary messages then refer to.
    pub fn schema(&mut self, schema: &Schema, descriptor: Option<FlightDescriptor>) -> FlightData {
        let encoded = self.generator.schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut self.dictionaries,
            &self.options,
        );
        let mut data: FlightData = encoded.into();
        data.flight_descriptor = descriptor;
        data
    }

    /// The messages of one batch; the last one (the batch itself) carries `app_metadata`.
    pub fn batch(
        &mut self,
        batch: &RecordBatch,
        app_metadata: Bytes,
    ) -> Result<Vec<FlightData>, ArrowError> {
        let (dictionaries, data) = self.generator.encode(
            batch,
            &mut self.dictionaries,
            &self.options,
            &mut self.compression,
        )?;
        let mut out: Vec<FlightData> = dictionaries.into_iter().map(Into::into).collect();
        let mut data: FlightData = data.into();
        data.app_metadata = app_metadata;
        out.push(data);
        Ok(out)
    }
}

/// Refuses a Flight message the IPC reader must not see: a truncated or crafted batch would
/// panic it or make it allocate what a length field claims (see
/// `mink_log::codec::check_message`). Put it in front of every `FlightDataDecoder`.
pub fn checked(data: FlightData) -> Result<FlightData, FlightError> {
    // pyarrow's `write_metadata`: arrow's decoder answered it with a flatbuffer range error.
    if data.data_header.is_empty() && data.data_body.is_empty() && !data.app_metadata.is_empty() {
        return Err(FlightError::ProtocolError(
            "a message of app_metadata alone carries no batch: send the metadata with its batch \
             (pyarrow: write_with_metadata)"
                .into(),
        ));
    }
    if !data.data_header.is_empty() {
        mink_log::codec::check_message(&data.data_header, &data.data_body)
            .map_err(|e| FlightError::DecodeError(e.to_string()))?;
    }
    Ok(data)
}

/// Decodes a Flight stream as arrow-flight's `FlightDataDecoder` does (same payloads, same
/// errors), but record batches through `mink_log::codec::read_batch`, which keeps one zstd
/// context per thread instead of creating one per batch.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    schema: Option<arrow::datatypes::SchemaRef>,
    dictionaries: std::collections::HashMap<i64, arrow::array::ArrayRef>,
}

impl StreamDecoder {
    /// The decoded message, or `None` for a dictionary (kept for the batches that use it).
    /// Put [`checked`] in front: the message must have passed it.
    pub fn decode(&mut self, data: FlightData) -> Result<Option<DecodedFlightData>, FlightError> {
        use arrow::ipc::MessageHeader;
        let message = arrow::ipc::root_as_message(&data.data_header[..])
            .map_err(|e| FlightError::DecodeError(format!("Error decoding root message: {e}")))?;
        match message.header_type() {
            MessageHeader::NONE => Ok(Some(DecodedFlightData::new_none(data))),
            MessageHeader::Schema => {
                let schema = Arc::new(Schema::try_from(&data).map_err(|e| {
                    FlightError::DecodeError(format!("Error decoding schema: {e}"))
                })?);
                self.schema = Some(Arc::clone(&schema));
                self.dictionaries.clear();
                Ok(Some(DecodedFlightData::new_schema(data, schema)))
            }
            MessageHeader::DictionaryBatch => {
                let schema = self.schema.as_ref().ok_or_else(|| {
                    FlightError::protocol("Received DictionaryBatch prior to Schema")
                })?;
                let dictionary = message.header_as_dictionary_batch().ok_or_else(|| {
                    FlightError::protocol(
                        "Could not get dictionary batch from DictionaryBatch message",
                    )
                })?;
                arrow::ipc::reader::read_dictionary(
                    &arrow::buffer::Buffer::from(data.data_body.clone()),
                    dictionary,
                    schema,
                    &mut self.dictionaries,
                    &message.version(),
                )
                .map_err(|e| {
                    FlightError::DecodeError(format!("Error decoding ipc dictionary: {e}"))
                })?;
                Ok(None)
            }
            MessageHeader::RecordBatch => {
                let schema = self
                    .schema
                    .as_ref()
                    .ok_or_else(|| FlightError::protocol("Received RecordBatch prior to Schema"))?;
                let batch = message.header_as_record_batch().ok_or_else(|| {
                    FlightError::protocol("Unable to convert flight data header to a record batch")
                })?;
                let decoded = mink_log::codec::read_batch(
                    &data.data_body,
                    batch,
                    Arc::clone(schema),
                    &self.dictionaries,
                    &message.version(),
                )
                .map_err(|e| {
                    FlightError::DecodeError(format!("Error decoding ipc RecordBatch: {e}"))
                })?;
                Ok(Some(DecodedFlightData::new_record_batch(data, decoded)))
            }
            other => Err(FlightError::protocol(format!(
                "Unexpected message: {}",
                other.variant_name().unwrap_or("UNKNOWN")
            ))),
        }
    }
}

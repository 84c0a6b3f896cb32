// ElasticBatchDataset: this worker's slice of each global batch, resharded at
// runtime.
//
// The world size, this worker's rank and the global cursor (the next global
// batch of the current pass) are int64 variables read at every GetNext, so a
// membership change needs no pipeline rebuild. GetNext advances the cursor
// variable itself, at hand-out: as long as nothing buffers elements after this
// dataset, the cursor always equals the number of global batches handed to the
// training step, so committing it and assigning it back is an exact rollback,
// and a newcomer given the cursor starts exactly there. Batches prepared ahead
// (indexed inputs only) are handed out only if they were cut for the state
// read at hand-out.
#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cc/kernels/elastic_batch_plan.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/framework/partial_tensor_shape.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/strcat.h"
#include "tensorflow/core/util/batch_util.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::DataTypeVector;
using tensorflow::DT_INT64;
using tensorflow::DT_RESOURCE;
using tensorflow::mutex;
using tensorflow::mutex_lock;
using tensorflow::Node;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::ResourceHandle;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
using tensorflow::data::CardinalityOptions;
using tensorflow::data::DatasetBase;
using tensorflow::data::DatasetContext;
using tensorflow::data::DatasetIterator;
using tensorflow::data::IndexMapperFn;
using tensorflow::data::IteratorBase;
using tensorflow::data::IteratorContext;
using tensorflow::data::IteratorStateReader;
using tensorflow::data::IteratorStateWriter;
using tensorflow::data::kInfiniteCardinality;
using tensorflow::data::kUnknownCardinality;
using tensorflow::data::SerializationContext;
using tensorflow::data::UnaryDatasetOpKernel;

constexpr char kDatasetType[] = "ElasticBatch";
constexpr char kGlobalBatchSize[] = "global_batch_size";
constexpr char kInputCardinality[] = "input_cardinality";
constexpr char kCursor[] = "cursor";
constexpr char kExhausted[] = "exhausted";
constexpr char kStreamPosition[] = "stream_position";
constexpr char kInputExhausted[] = "input_exhausted";
constexpr char kInputImplEmpty[] = "input_impl_empty";
// Enough to keep the lookahead thread busy through one hand-out.
constexpr size_t kLookaheadBatches = 2;
// The generation of a production that nothing supersedes (GetNext's own).
constexpr int64_t kNotAbortable = -1;

// A scalar int64 resource variable owned by the strategy.
class StateVariable {
 public:
  static absl::Status FromInput(OpKernelContext* ctx, int index, const char* name,
                                StateVariable* out) {
    out->name_ = name;
    out->handle_tensor_ = ctx->input(index);
    if (out->handle_tensor_.dtype() != DT_RESOURCE || out->handle_tensor_.NumElements() != 1) {
      return tensorflow::errors::InvalidArgument(name, " must be a scalar resource variable");
    }
    const ResourceHandle& handle = out->handle_tensor_.scalar<ResourceHandle>()();
    TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, handle, &out->var_));
    return out->Read().status();
  }

  absl::StatusOr<int64_t> Read() const {
    tensorflow::tf_shared_lock lock(*var_->mu());
    const Tensor& value = *var_->tensor();
    if (!var_->is_initialized || value.dtype() != DT_INT64 || value.dims() != 0) {
      return tensorflow::errors::InvalidArgument(
          name_, " must be an initialized scalar int64 variable, got ",
          var_->is_initialized ? var_->DebugString() : "an uninitialized variable");
    }
    return value.scalar<int64_t>()();
  }

  // Replaces the buffer rather than writing in place: readers may still hold
  // the old one.
  void Write(int64_t value) const {
    Tensor fresh(DT_INT64, TensorShape({}));
    fresh.scalar<int64_t>()() = value;
    mutex_lock lock(*var_->mu());
    *var_->tensor() = std::move(fresh);
  }

  const Tensor& handle_tensor() const { return handle_tensor_; }

 private:
  std::string name_;
  Tensor handle_tensor_;
  tensorflow::core::RefCountPtr<Var> var_;
};

class ElasticBatchDatasetOp : public UnaryDatasetOpKernel {
 public:
  explicit ElasticBatchDatasetOp(OpKernelConstruction* ctx) : UnaryDatasetOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("drop_remainder", &drop_remainder_));
  }

 protected:
  void MakeDataset(OpKernelContext* ctx, DatasetBase* input, DatasetBase** output) override;

 private:
  class Dataset;
  bool drop_remainder_ = false;
};

class ElasticBatchDatasetOp::Dataset : public DatasetBase {
 public:
  Dataset(OpKernelContext* ctx, const DatasetBase* input, int64_t global_batch_size,
          bool drop_remainder, StateVariable world_size, StateVariable rank,
          StateVariable cursor)
      : DatasetBase(DatasetContext(ctx)),
        input_(input),
        global_batch_size_(global_batch_size),
        drop_remainder_(drop_remainder),
        world_size_(std::move(world_size)),
        rank_(std::move(rank)),
        cursor_(std::move(cursor)),
        input_cardinality_(input->Cardinality()),
        // Random access needs a known size to tell where a pass ends.
        random_access_(input->RandomIndexingCompatible().ok() && input_cardinality_ >= 0) {
    input_->Ref();
    for (const PartialTensorShape& shape : input_->output_shapes()) {
      output_shapes_.push_back(PartialTensorShape({-1}).Concatenate(shape));
    }
  }

  ~Dataset() override { input_->Unref(); }

  std::unique_ptr<IteratorBase> MakeIteratorInternal(const std::string& prefix) const override;

  const DataTypeVector& output_dtypes() const override { return input_->output_dtypes(); }

  const std::vector<PartialTensorShape>& output_shapes() const override {
    return output_shapes_;
  }

  std::string DebugString() const override {
    return tensorflow::strings::StrCat(kDatasetType, "DatasetOp(", global_batch_size_, ")::Dataset");
  }

  // Global batches in a full pass; the world size does not change it.
  int64_t CardinalityInternal(CardinalityOptions options) const override {
    const int64_t n = input_->Cardinality(options);
    if (n == kInfiniteCardinality || n == kUnknownCardinality) return n;
    return drop_remainder_ ? n / global_batch_size_
                           : (n + global_batch_size_ - 1) / global_batch_size_;
  }

  absl::Status InputDatasets(std::vector<const DatasetBase*>* inputs) const override {
    inputs->push_back(input_);
    return absl::OkStatus();
  }

  // The variables are the strategy's state, committed and restored by it; the
  // iterator's own checkpoint is complete relative to them.
  absl::Status CheckExternalState() const override { return input_->CheckExternalState(); }

 protected:
  absl::Status AsGraphDefInternal(SerializationContext* ctx, DatasetGraphDefBuilder* b,
                                  Node** output) const override {
    // tf.data rewrites (optimizations, autotune) serialize the pipeline and
    // rebuild it in this process: feed the very handles back through
    // placeholders so the rebuilt dataset reads the same variables.
    if (!ctx->is_graph_rewrite() || ctx->input_list() == nullptr) {
      return tensorflow::errors::Unimplemented(
          "An elastic dataset reads the strategy's world-size, rank and cursor variables and "
          "cannot be serialized into a standalone graph (tf.data service, SavedModel); build "
          "it in the training process instead");
    }
    Node* input_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddInputDataset(ctx, input_, &input_node));
    Node* global_batch_size_node = nullptr;
    TF_RETURN_IF_ERROR(b->AddScalar(global_batch_size_, &global_batch_size_node));
    std::vector<Node*> inputs = {input_node, global_batch_size_node};
    for (const StateVariable* variable : {&world_size_, &rank_, &cursor_}) {
      Node* handle_node = nullptr;
      TF_RETURN_IF_ERROR(b->AddPlaceholder(variable->handle_tensor(), &handle_node));
      ctx->input_list()->emplace_back(handle_node->name(), variable->handle_tensor());
      inputs.push_back(handle_node);
    }
    tensorflow::AttrValue drop_remainder;
    b->BuildAttrValue(drop_remainder_, &drop_remainder);
    return b->AddDataset(this, inputs, {{"drop_remainder", drop_remainder}}, output);
  }

 private:
  class Iterator;

  const DatasetBase* const input_;
  const int64_t global_batch_size_;
  const bool drop_remainder_;
  const StateVariable world_size_;
  const StateVariable rank_;
  const StateVariable cursor_;
  const int64_t input_cardinality_;
  const bool random_access_;
  std::vector<PartialTensorShape> output_shapes_;
};

class ElasticBatchDatasetOp::Dataset::Iterator : public DatasetIterator<Dataset> {
 public:
  explicit Iterator(const Params& params) : DatasetIterator<Dataset>(params) {}

  ~Iterator() override {
    {
      mutex_lock lock(mu_);
      cancelled_ = true;
      lookahead_changed_.notify_all();
    }
    lookahead_thread_.reset();  // joins
  }

  absl::Status GetNextInternal(IteratorContext* ctx, std::vector<Tensor>* out_tensors,
                               bool* end_of_sequence) override {
    mutex_lock lock(mu_);
    *end_of_sequence = exhausted_;
    if (exhausted_) return absl::OkStatus();
    TF_ASSIGN_OR_RETURN(const int64_t cursor, dataset()->cursor_.Read());
    TF_ASSIGN_OR_RETURN(const int64_t world_size, dataset()->world_size_.Read());
    TF_ASSIGN_OR_RETURN(const int64_t rank, dataset()->rank_.Read());
    const BatchKey key{cursor, world_size, rank};
    while (lookahead_.empty() && producing_) lookahead_changed_.wait(lock);
    // A batch prepared ahead counts only if it was cut for exactly the state
    // read now, at hand-out: that check is what makes the lookahead safe.
    Prepared current;
    if (!lookahead_.empty() && lookahead_.front().key == key) {
      current = std::move(lookahead_.front());
      lookahead_.pop_front();
    } else {
      StopLookahead(lock);
      current.key = key;
      Prepare(ctx, kNotAbortable, &current);
      // Only an indexed input can afford wrong guesses: it re-maps in O(1).
      if (dataset()->random_access_ && current.status.ok() && !current.end_of_sequence) {
        StartLookahead(ctx, BatchKey{cursor + 1, world_size, rank});
      }
    }
    lookahead_changed_.notify_all();
    TF_RETURN_IF_ERROR(current.status);
    if (current.end_of_sequence) {
      if (cursor == 0) {
        return tensorflow::errors::InvalidArgument(
            "The input of the elastic dataset has no global batch: it is empty",
            dataset()->drop_remainder_
                ? tensorflow::strings::StrCat(", or has fewer than global_batch_size (",
                                              dataset()->global_batch_size_,
                                              ") elements and drop_remainder is set")
                : "");
      }
      // The next pass starts at global batch 0; this iterator stays at its end.
      exhausted_ = true;
      dataset()->cursor_.Write(0);
      *end_of_sequence = true;
      return absl::OkStatus();
    }
    *out_tensors = std::move(current.batch);
    dataset()->cursor_.Write(cursor + 1);
    *end_of_sequence = false;
    return absl::OkStatus();
  }

 protected:
  std::shared_ptr<tensorflow::data::model::Node> CreateNode(
      IteratorContext* ctx, tensorflow::data::model::Node::Args args) const override {
    return tensorflow::data::model::MakeUnknownRatioNode(std::move(args));
  }

  absl::Status SaveInternal(SerializationContext* ctx, IteratorStateWriter* writer) override {
    mutex_lock lock(mu_);
    StopLookahead(lock);
    TF_ASSIGN_OR_RETURN(const int64_t cursor, dataset()->cursor_.Read());
    TF_RETURN_IF_ERROR(
        writer->WriteScalar(prefix(), kGlobalBatchSize, dataset()->global_batch_size_));
    TF_RETURN_IF_ERROR(
        writer->WriteScalar(prefix(), kInputCardinality, dataset()->input_cardinality_));
    TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kCursor, cursor));
    TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kExhausted, exhausted_ ? 1 : 0));
    // An indexed input is re-created at the cursor on demand; only a stream's
    // position is worth keeping.
    const bool keep_input = !dataset()->random_access_ && input_impl_ != nullptr;
    TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kInputImplEmpty, keep_input ? 0 : 1));
    if (keep_input) {
      TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kStreamPosition, stream_position_));
      TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kInputExhausted, input_exhausted_ ? 1 : 0));
      TF_RETURN_IF_ERROR(SaveInput(ctx, writer, input_impl_));
    }
    return absl::OkStatus();
  }

  absl::Status RestoreInternal(IteratorContext* ctx, IteratorStateReader* reader) override {
    mutex_lock lock(mu_);
    StopLookahead(lock);
    int64_t global_batch_size = 0;
    int64_t input_cardinality = 0;
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kGlobalBatchSize, &global_batch_size));
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputCardinality, &input_cardinality));
    if (global_batch_size != dataset()->global_batch_size_) {
      return tensorflow::errors::FailedPrecondition(
          "Cannot restore an elastic input iterator saved with global_batch_size=",
          global_batch_size, " into a pipeline with global_batch_size=",
          dataset()->global_batch_size_, ": the cursor counts global batches of the saved size");
    }
    if (input_cardinality != dataset()->input_cardinality_) {
      return tensorflow::errors::FailedPrecondition(
          "Cannot restore an elastic input iterator saved over an input of ",
          input_cardinality, " elements into a pipeline whose input has ",
          dataset()->input_cardinality_, " (negative: infinite or unknown): it is another input");
    }
    int64_t cursor = 0;
    int64_t exhausted = 0;
    int64_t input_empty = 1;
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kCursor, &cursor));
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kExhausted, &exhausted));
    TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputImplEmpty, &input_empty));
    exhausted_ = exhausted != 0;
    input_impl_.reset();
    stream_position_ = 0;
    input_exhausted_ = false;
    if (input_empty == 0 && !dataset()->random_access_) {
      int64_t input_exhausted = 0;
      TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kStreamPosition, &stream_position_));
      TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kInputExhausted, &input_exhausted));
      input_exhausted_ = input_exhausted != 0;
      TF_RETURN_IF_ERROR(dataset()->input_->MakeIterator(ctx, this, prefix(), &input_impl_));
      TF_RETURN_IF_ERROR(RestoreInput(ctx, reader, input_impl_));
    }
    dataset()->cursor_.Write(cursor);
    return absl::OkStatus();
  }

 private:
  // The state a batch is cut for.
  struct BatchKey {
    int64_t cursor = -1;
    int64_t world_size = 0;
    int64_t rank = 0;
    bool operator==(const BatchKey& other) const {
      return cursor == other.cursor && world_size == other.world_size && rank == other.rank;
    }
  };

  // One batch, ready to hand out.
  struct Prepared {
    BatchKey key;
    absl::Status status;
    bool end_of_sequence = false;
    std::vector<Tensor> batch;
  };

  // Reads the input: called with mu_ held and no production running, or by
  // the lookahead thread while producing_ is set (GetNext then waits before
  // touching the input itself). A lookahead production gives up as soon as
  // its generation is superseded, so a reshard does not wait for it.
  void Prepare(IteratorContext* ctx, int64_t generation, Prepared* prepared) {
    prepared->status = Produce(ctx, generation, prepared->key.cursor, prepared->key.world_size,
                               prepared->key.rank, &prepared->end_of_sequence,
                               &prepared->batch);
  }

  absl::Status Produce(IteratorContext* ctx, int64_t generation, int64_t cursor,
                       int64_t world_size, int64_t rank, bool* end_of_sequence,
                       std::vector<Tensor>* batch_tensors) {
    BatchSlice full;
    TF_RETURN_IF_ERROR(
        ComputeGlobalBatchSlice(cursor, dataset()->global_batch_size_, world_size, rank, &full));
    WorkerBatch batch;
    std::vector<std::vector<Tensor>> elements;
    TF_RETURN_IF_ERROR(dataset()->random_access_
                           ? ReadIndexed(ctx, generation, cursor, world_size, rank, full,
                                         &batch, &elements)
                           : ReadStream(ctx, cursor, full, &batch, &elements));
    *end_of_sequence = batch.end_of_sequence;
    if (batch.end_of_sequence) return absl::OkStatus();
    return Stack(ctx, &elements, batch_tensors);
  }

  // Prepares the next global batches for the current membership on a
  // background thread while the training step runs, so that the step finds
  // its batch ready.
  void StartLookahead(IteratorContext* ctx, const BatchKey& next)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (lookahead_thread_ == nullptr) {
      lookahead_ctx_ = std::make_unique<IteratorContext>(*ctx);
      lookahead_thread_ = ctx->StartThread("elastic_batch_lookahead",
                                           [this]() { LookaheadLoop(); });
    }
    next_to_prepare_ = next;
  }

  // Drops what was prepared and waits for a running production to end, after
  // which the caller owns the input.
  void StopLookahead(mutex_lock& lock) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++lookahead_generation_;
    next_to_prepare_.reset();
    lookahead_.clear();
    while (producing_) lookahead_changed_.wait(lock);
  }

  void LookaheadLoop() {
    while (true) {
      Prepared prepared;
      int64_t generation = 0;
      {
        mutex_lock lock(mu_);
        while (!cancelled_ &&
               !(next_to_prepare_.has_value() && lookahead_.size() < kLookaheadBatches)) {
          lookahead_changed_.wait(lock);
        }
        if (cancelled_) return;
        prepared.key = *next_to_prepare_;
        ++next_to_prepare_->cursor;
        generation = lookahead_generation_;
        producing_ = true;
      }
      Prepare(lookahead_ctx_.get(), generation, &prepared);
      mutex_lock lock(mu_);
      producing_ = false;
      if (generation == lookahead_generation_) {
        // Nothing follows an error or the end of the pass.
        if (!prepared.status.ok() || prepared.end_of_sequence) next_to_prepare_.reset();
        lookahead_.push_back(std::move(prepared));
      }
      lookahead_changed_.notify_all();
    }
  }

  // Which slices the current indexed input iterator yields.
  struct Mapping {
    int64_t next_cursor = -1;
    int64_t world_size = 0;
    int64_t rank = 0;
  };

  // Indexed input: an input iterator whose index mapper yields this worker's
  // slices of consecutive global batches. It is re-created (O(1), no replay)
  // when the cursor jumps or the membership changes; anything it prefetched
  // for the old mapping goes with it.
  absl::Status ReadIndexed(IteratorContext* ctx, int64_t generation, int64_t cursor,
                           int64_t world_size, int64_t rank, const BatchSlice& full,
                           WorkerBatch* batch, std::vector<std::vector<Tensor>>* elements) {
    const int64_t global_batch_size = dataset()->global_batch_size_;
    *batch = PlanWorkerBatch(full, cursor, global_batch_size,
                             dataset()->input_cardinality_ - cursor * global_batch_size,
                             dataset()->drop_remainder_);
    if (batch->end_of_sequence || batch->size == 0) return absl::OkStatus();
    if (input_impl_ == nullptr || mapping_.next_cursor != cursor ||
        mapping_.world_size != world_size || mapping_.rank != rank) {
      const int64_t offset = full.start - cursor * global_batch_size;
      const int64_t size = full.size;
      const int64_t cardinality = dataset()->input_cardinality_;
      index_mapper_ = [cursor, global_batch_size, offset, size,
                       cardinality](size_t k) -> absl::StatusOr<size_t> {
        const int64_t index = SliceStreamIndex(static_cast<int64_t>(k), cursor,
                                               global_batch_size, offset, size);
        if (index >= cardinality) return absl::OutOfRangeError("past the end of the input");
        return static_cast<size_t>(index);
      };
      IteratorContext mapped_ctx = WithIndexMapper(ctx);
      TF_RETURN_IF_ERROR(dataset()->input_->MakeIterator(&mapped_ctx, this, prefix(), &input_impl_));
      mapping_ = Mapping{cursor, world_size, rank};
    }
    IteratorContext mapped_ctx = WithIndexMapper(ctx);
    elements->resize(batch->size);
    for (std::vector<Tensor>& element : *elements) {
      if (generation != kNotAbortable && generation != lookahead_generation_.load()) {
        mapping_.next_cursor = -1;  // stopped mid-slice
        return absl::CancelledError("superseded by a membership change or a rollback");
      }
      bool end_of_input = false;
      TF_RETURN_IF_ERROR(input_impl_->GetNext(&mapped_ctx, &element, &end_of_input));
      if (end_of_input) {
        return tensorflow::errors::Internal("The elastic dataset's input ended before its ",
                                            dataset()->input_cardinality_, " elements");
      }
    }
    // A clipped last batch breaks the mapping's rhythm; the pass ends next anyway.
    mapping_.next_cursor = batch->size == full.size ? cursor + 1 : -1;
    return absl::OkStatus();
  }

  IteratorContext WithIndexMapper(IteratorContext* ctx) const {
    IteratorContext::Params params(ctx);
    params.index_mapper = index_mapper_;
    return IteratorContext(std::move(params));
  }

  // Streaming input: every worker reads the whole stream in order and keeps
  // its slice, like ShardDataset. Reading through to the end of the global
  // batch tells each worker how many elements it has, hence the same plan on
  // every worker. Only a jump back (rollback) re-creates the input and skips
  // forward: that fast-forward is O(cursor) for a stream.
  absl::Status ReadStream(IteratorContext* ctx, int64_t cursor, const BatchSlice& full,
                          WorkerBatch* batch,
                          std::vector<std::vector<Tensor>>* elements) {
    const int64_t batch_start = cursor * dataset()->global_batch_size_;
    if (input_impl_ == nullptr || stream_position_ > full.start) {
      TF_RETURN_IF_ERROR(dataset()->input_->MakeIterator(ctx, this, prefix(), &input_impl_));
      stream_position_ = 0;
      input_exhausted_ = false;
    }
    TF_RETURN_IF_ERROR(SkipTo(ctx, full.start));
    while (stream_position_ < full.start + full.size && !input_exhausted_) {
      std::vector<Tensor> element;
      TF_RETURN_IF_ERROR(input_impl_->GetNext(ctx, &element, &input_exhausted_));
      if (input_exhausted_) break;
      elements->push_back(std::move(element));
      ++stream_position_;
    }
    TF_RETURN_IF_ERROR(SkipTo(ctx, batch_start + dataset()->global_batch_size_));
    *batch = PlanWorkerBatch(full, cursor, dataset()->global_batch_size_,
                             stream_position_ - batch_start, dataset()->drop_remainder_);
    elements->resize(batch->end_of_sequence ? 0 : batch->size);
    return absl::OkStatus();
  }

  absl::Status SkipTo(IteratorContext* ctx, int64_t target) {
    while (stream_position_ < target && !input_exhausted_) {
      const int chunk = static_cast<int>(
          std::min<int64_t>(target - stream_position_, std::numeric_limits<int>::max()));
      int skipped = 0;
      TF_RETURN_IF_ERROR(input_impl_->Skip(ctx, chunk, &input_exhausted_, &skipped));
      stream_position_ += skipped;
    }
    return absl::OkStatus();
  }

  // Stacks the elements into one batch; an empty part of a partial last batch
  // gets zero rows (unknown dimensions become 0).
  absl::Status Stack(IteratorContext* ctx, std::vector<std::vector<Tensor>>* elements,
                     std::vector<Tensor>* out_tensors) const {
    const DataTypeVector& dtypes = dataset()->output_dtypes();
    const int64_t rows = static_cast<int64_t>(elements->size());
    for (size_t component = 0; component < dtypes.size(); ++component) {
      TensorShape row_shape;
      if (rows > 0) {
        row_shape = (*elements)[0][component].shape();
      } else {
        for (int64_t dim : dataset()->input_->output_shapes()[component].dim_sizes()) {
          row_shape.AddDim(std::max<int64_t>(dim, 0));
        }
      }
      TensorShape batch_shape = row_shape;
      batch_shape.InsertDim(0, rows);
      Tensor batch(ctx->allocator({}), dtypes[component], batch_shape);
      for (int64_t row = 0; row < rows; ++row) {
        const Tensor& value = (*elements)[row][component];
        if (value.shape() != row_shape) {
          return tensorflow::errors::InvalidArgument(
              "Cannot batch elements of different shapes: component ", component,
              " has shape ", row_shape.DebugString(), " in the first element of the batch and ",
              value.shape().DebugString(), " in element ", row,
              "; pad or resize the elements before the elastic dataset");
        }
        TF_RETURN_IF_ERROR(tensorflow::batch_util::CopyElementToSlice(value, &batch, row));
      }
      out_tensors->push_back(std::move(batch));
    }
    return absl::OkStatus();
  }

  mutex mu_;
  tensorflow::condition_variable lookahead_changed_;
  bool cancelled_ TF_GUARDED_BY(mu_) = false;
  bool exhausted_ TF_GUARDED_BY(mu_) = false;
  // The lookahead: batches prepared for the next cursors, in order.
  std::deque<Prepared> lookahead_ TF_GUARDED_BY(mu_);
  std::optional<BatchKey> next_to_prepare_ TF_GUARDED_BY(mu_);
  // Written under mu_, read without it by an aborting production.
  std::atomic<int64_t> lookahead_generation_{0};
  bool producing_ TF_GUARDED_BY(mu_) = false;
  std::unique_ptr<IteratorContext> lookahead_ctx_;
  std::unique_ptr<tensorflow::Thread> lookahead_thread_;
  // The input's state, owned as Prepare describes.
  std::unique_ptr<IteratorBase> input_impl_;
  Mapping mapping_;
  IndexMapperFn index_mapper_;
  int64_t stream_position_ = 0;
  bool input_exhausted_ = false;
};

std::unique_ptr<IteratorBase> ElasticBatchDatasetOp::Dataset::MakeIteratorInternal(
    const std::string& prefix) const {
  return std::make_unique<Iterator>(
      Iterator::Params{this, tensorflow::strings::StrCat(prefix, "::", kDatasetType)});
}

void ElasticBatchDatasetOp::MakeDataset(OpKernelContext* ctx, DatasetBase* input,
                                        DatasetBase** output) {
  int64_t global_batch_size = 0;
  OP_REQUIRES_OK(ctx, tensorflow::data::ParseScalarArgument<int64_t>(ctx, kGlobalBatchSize,
                                                                      &global_batch_size));
  OP_REQUIRES(ctx, global_batch_size > 0,
              tensorflow::errors::InvalidArgument("global_batch_size must be positive, got ",
                                                  global_batch_size));
  OP_REQUIRES(ctx, input->Cardinality() != 0,
              tensorflow::errors::InvalidArgument("The input of the elastic dataset is empty"));
  StateVariable world_size;
  StateVariable rank;
  StateVariable cursor;
  OP_REQUIRES_OK(ctx, StateVariable::FromInput(ctx, 2, "world_size", &world_size));
  OP_REQUIRES_OK(ctx, StateVariable::FromInput(ctx, 3, "rank", &rank));
  OP_REQUIRES_OK(ctx, StateVariable::FromInput(ctx, 4, "cursor", &cursor));
  *output = new Dataset(ctx, input, global_batch_size, drop_remainder_, std::move(world_size),
                        std::move(rank), std::move(cursor));
}

REGISTER_KERNEL_BUILDER(Name("ElasticBatchDataset").Device(tensorflow::DEVICE_CPU),
                        ElasticBatchDatasetOp);

}  // namespace
}  // namespace tensorflow_elastic
